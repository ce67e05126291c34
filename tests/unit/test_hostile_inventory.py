"""Hostile inventory values: refused when the inventory is loaded, with one line naming host and
value; and where a value gets through (or a plan is built by hand), the scripts and ssh argv
distrun renders still run it as one word, never as shell text or an ssh option."""

from __future__ import annotations

import dataclasses
import getpass
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from distrun.errors import InventoryError, PlanError
from distrun.inventory.cluster import Node, cluster_from_json
from distrun.launchers.slurm import sbatch_files
from distrun.planning.run_files import launch_scripts, render_rank_wrapper
from distrun.run.attempt_shell import tail_command, wait_command
from distrun.run.logs import remote_log_command
from distrun.transport import rundir
from distrun.transport.remote import shell_argv

from .plans import plan_for
from .test_cli import run

HOSTILE = ["n1;touch /tmp/pwned", "n$(touch /tmp/pwned)", "n`touch /tmp/pwned`", "n1\ntouch /tmp/pwned",
           "-oProxyCommand=touch /tmp/pwned", "n 1", "n1|id", "n1&id"]


def inv(hosts: dict[str, dict], head: str, **group_vars) -> dict:
    return {
        "_meta": {"hostvars": {h: {**group_vars, **hv} for h, hv in hosts.items()}},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": [head]},
        "workers": {"hosts": list(hosts)},
    }


def load(hosts: dict[str, dict], head: str = "n1", **gv):
    return cluster_from_json(Path("/inv/hosts.yml"), inv(hosts, head, **gv))


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_host_name_is_refused_naming_it(name):
    with pytest.raises(InventoryError) as exc:
        load({"n1": {"ansible_host": "10.0.0.1"}, name: {"ansible_host": "10.0.0.2"}})
    assert repr(name) in one_line(exc)
    assert "host name" in str(exc.value) and "ansible_host" in str(exc.value)


@pytest.mark.parametrize("address", HOSTILE + ["10.0.0.1 -oProxyCommand=x", "", "a..b"])
def test_a_hostile_address_is_refused_naming_host_and_value(address):
    hv = {"ansible_host": address} if address else {}
    name = "n2" if address else "-n2"
    with pytest.raises(InventoryError) as exc:
        load({"n1": {"ansible_host": "10.0.0.1"}, name: hv})
    line = one_line(exc)
    if address:
        assert f"host n2 has ansible_host={address!r}" in line
        assert "IP address or a DNS name" in line


@pytest.mark.parametrize("address", ["10.0.0.2", "fe80::1", "node2", "node-2.example.com", "node_2.lan."])
def test_ip_addresses_and_dns_names_are_accepted(address):
    cluster = load({"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": address}})
    assert cluster.workers[1].address == address


@pytest.mark.parametrize(("key", "value"), [
    ("slurm_partition", "gpu\n#SBATCH --uid=0"),
    ("slurm_partition", "gpu;id"),
    ("slurm_time_limit", "1:00\ntouch /tmp/pwned"),
    ("slurm_time_limit", "$(id)"),
    ("slurm_srun_mpi", "pmix --export=ALL"),
    ("distrun_shared_dir", "/srv/x\ny"),
    ("distrun_shared_dir", "/srv/$(id)"),
    ("distrun_env_prefix", "/opt/`id`"),
    ("distrun_user", "root;id"),
    ("distrun_iface", "eth0;id"),
    ("ansible_user", "-oProxyCommand=x"),
])
def test_values_that_land_in_scripts_are_refused(key, value):
    with pytest.raises(InventoryError) as exc:
        load({"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}}, **{key: value})
    assert f"has {key}={value!r}" in one_line(exc)


def test_the_cli_refuses_a_hostile_inventory_in_one_line(write_inventory, cli_env):
    for hosts in (
        {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "$(touch /tmp/pwned)"}},
        {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "-oProxyCommand=touch /tmp/pwned"}},
        {"n1": {"ansible_host": "10.0.0.1"}, "n2;id": {"ansible_host": "10.0.0.2"}},
        {"n1": {"ansible_host": "10.0.0.1", "slurm_partition": "gpu\ntouch /tmp/pwned"}, "n2": {}},
    ):
        text = json.dumps({"all": {"children": {"head": {"hosts": {"n1": None}},
                                                "workers": {"hosts": hosts}}}})
        path = write_inventory(text)
        for verb in (["hostfile"], ["train", "--dry-run", "--epochs", "1"]):
            proc = run([*verb, "--inventory", str(path)], cli_env)
            assert proc.returncode != 0, proc.stdout
            assert "Traceback" not in proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1, proc.stderr
            assert lines[0].startswith("distrun: error: inventory ") and str(path) in lines[0]
            assert "n2" in lines[0] or "n1" in lines[0]


# Defence in depth: a plan whose names and address were never checked (built by hand).
PAYLOAD = "$(touch {c})`touch {c}`;touch {c}\ntouch {c}"


def hostile_plan(tmp_path: Path, launcher: str):
    cluster = load({"n1": {"ansible_host": "10.0.0.1", "slots": 1}, "n2": {"ansible_host": "10.0.0.2", "slots": 1}},
                   distrun_shared_dir=str(tmp_path / "shared"))
    plan = plan_for(cluster, run_id="r1", launcher=launcher, workload=None, script="job.py",
                      slurm={"partition": "gpu"} if launcher == "slurm" else None)
    # Relative: the scripts run in the run dir, and a name with "/" could not name a file there.
    canary = Path(plan.run_dir) / "pwned"
    bad = PAYLOAD.format(c="pwned")
    hosts = (dataclasses.replace(plan.placement.hosts[0], name="n1" + bad), *plan.placement.hosts[1:])
    plan = dataclasses.replace(plan, placement=dataclasses.replace(plan.placement, hosts=hosts, master_addr="10.0.0.1" + bad))
    # No real mpirun runs: on a machine that has one, it would try ssh to the made-up addresses and
    # hold the script for as long as the network lets it. The script's own lines are what is tested.
    plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, mpi_prefix=str(tmp_path / "no-mpi")))
    Path(rundir.attempt_path(plan)).mkdir(parents=True)
    return plan, bad, canary


def bash(script: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    syntax = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    return subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True, cwd=cwd, timeout=30)


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_launch_scripts_and_the_rank_wrapper_treat_a_hostile_name_as_a_word(tmp_path, launcher):
    plan, bad, canary = hostile_plan(tmp_path, launcher)
    run_dir = Path(rundir.attempt_path(plan))
    for host, script in launch_scripts(plan).items():
        bash(script, run_dir)
        assert not canary.exists() and not (run_dir / canary.name).exists(), f"launch script for {host!r} ran the payload"
        # The pid file carries the literal name: the shell never read it as code.
        assert (run_dir / f"launcher-{host}.pid").exists()
    wrapper = render_rank_wrapper(plan)
    out = bash(wrapper, run_dir, "printenv", "MASTER_ADDR")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n", 1)[1] == plan.placement.master_addr + "\n"  # after the wrapper's DISTRUN_RANK line
    assert not canary.exists()


def test_follow_commands_quote_the_host_name(tmp_path):
    plan, bad, canary = hostile_plan(tmp_path, "torchrun")
    plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, user=getpass.getuser()))  # the follower runs as the plan's user
    host = plan.placement.hosts[0].name
    run_dir = Path(rundir.attempt_path(plan))
    (run_dir / f"exitcode-{host}").write_text("7\n")
    out = bash(wait_command(plan, host), run_dir)
    # The node program takes the name as one JSON value, and no name but a plain one at all.
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("attempt.py: follow: host ") and "is empty or not a plain name" in out.stderr
    assert not canary.exists()
    assert subprocess.run(["bash", "-n", "-c", tail_command(plan, host)]).returncode == 0
    logs = remote_log_command({"hosts": [{"name": host, "slots": 1}], "launcher": "torchrun",
                               "shared_dir": str(tmp_path / "shared"), "run_id": "r1"}, 0)
    assert logs is not None and shlex.quote(host) in logs
    assert subprocess.run(["bash", "-n", "-c", logs]).returncode == 0


def test_sbatch_refuses_a_value_that_would_add_a_line(tmp_path):
    plan, _, _ = hostile_plan(tmp_path, "slurm")
    with pytest.raises(PlanError, match="#SBATCH --nodelist="):
        sbatch_files(plan)
    hosts = tuple(dataclasses.replace(h, name=f"n{i}") for i, h in enumerate(plan.placement.hosts))
    ok = dataclasses.replace(plan, placement=dataclasses.replace(plan.placement, hosts=hosts))
    with pytest.raises(PlanError, match="#SBATCH --partition="):
        sbatch_files(dataclasses.replace(ok, launch=dataclasses.replace(ok.launch, options={"partition": "gpu\ntouch /tmp/pwned"})))
    script = sbatch_files(ok)["job.sbatch"]
    assert all(line.startswith("#") for line in script.splitlines() if "SBATCH" in line)
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0


@pytest.mark.parametrize("address", ["-oProxyCommand=touch /tmp/pwned", "$(id)", "a b"])
def test_ssh_never_reads_the_destination_as_an_option(address):
    node = Node(name="n2", address=address, slots=1, slots_source="inventory", gpus=0, is_head=False,
                is_worker=True, hostvars={"ansible_user": "admin"})
    argv = shell_argv(node, "true")
    i = argv.index("--")
    assert argv[i + 1:] == [f"admin@{address}", "true"]
    assert all(not a.startswith(("admin@", address)) for a in argv[:i])
