"""An inventory whose names are not the machines' hostnames (``alpha ansible_host=10.0.0.11`` on a
machine called node1), as people write them: every launcher file and every message names a node by
its inventory name, and Slurm knows the nodes by those names too (rules.slurm_node_name)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from distrun.inventory import rules
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers import LAUNCHERS, slurm
from distrun.launchers.slurm import sbatch_files
from distrun.planning.run_files import render_rank_wrapper
from distrun.run.diagnosis import first_failure

from .plans import plan_for

ALIASES: dict[str, dict[str, object]] = {"alpha": {"ansible_host": "10.0.0.11"}, "w2": {"ansible_host": "10.0.0.12", "slots": 2},
                                          "w3": {"ansible_host": "10.0.0.13"}}
MACHINES = ("node1", "node2", "node3")  # the machines' own hostnames
ORDER = ["alpha", "w2", "w2", "w3"]  # one line per rank


def cluster(**gv):
    data = {
        "_meta": {"hostvars": {h: {"slurm_enabled": True, **gv, **hv} for h, hv in ALIASES.items()}},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": ["alpha"]},
        "workers": {"hosts": list(ALIASES)},
    }
    return cluster_from_json(Path("/inv/hosts.ini"), data, None)


def slurm_plan(mode):
    c = cluster()
    return plan_for(c, run_id="r1", launcher="slurm", slurm={"mode": mode} if mode else None, workload="ddp")


def test_slurm_knows_a_node_by_its_inventory_name():
    assert rules.slurm_node_name("w2") == "w2"
    assert rules.slurm_node_name("gpu-07.site.example") == "gpu-07.site.example"


def test_sbatch_files_of_an_aliased_plan_name_nodes_as_the_inventory_does():
    single = sbatch_files(slurm_plan("single"))
    assert "#SBATCH --nodelist=alpha,w2,w3" in single["job.sbatch"]
    # uneven slots: the arbitrary distribution lists inventory names, one line per rank
    assert single["slurm-hostfile"].split() == ORDER
    multi = sbatch_files(slurm_plan("multi-job"))
    nodelists = [next(line for line in text.splitlines() if line.startswith("#SBATCH --nodelist="))
                 for _, text in sorted(multi.items())]
    assert nodelists == ["#SBATCH --nodelist=alpha", "#SBATCH --nodelist=w2", "#SBATCH --nodelist=w3"]
    # The master's address is the name Slurm runs it under, which every node resolves
    # (a machine's own hostname need not be in the others' /etc/hosts).
    assert 'export MASTER_ADDR="$SLURMD_NODENAME"' in multi["job-0.sbatch"]
    # Each node's torchrun agent announces its cluster address, not the machine's hostname
    # (torch's default, which the other nodes cannot resolve): the first one's becomes the
    # ranks' MASTER_ADDR.
    addresses = [next(word for word in text.split() if word.startswith("--local-addr="))
                 for _, text in sorted(multi.items())]
    assert addresses == ["--local-addr=10.0.0.11", "--local-addr=10.0.0.12", "--local-addr=10.0.0.13"]
    for text in (*single.values(), *multi.values()):
        assert "hostname -s" not in text and not any(m in text for m in MACHINES)


def test_torchrun_agents_announce_their_cluster_address():
    plan = plan_for(cluster(), run_id="r1", launcher="torchrun", workload="ddp")
    launcher = LAUNCHERS["torchrun"]
    said = {h.name: [w for w in launcher.command(plan, h) if w.startswith("--local-addr=")] for h in plan.placement.hosts}
    assert said == {"alpha": ["--local-addr=10.0.0.11"], "w2": ["--local-addr=10.0.0.12"], "w3": ["--local-addr=10.0.0.13"]}
    assert plan.placement.master_addr == "10.0.0.11"


def test_the_driver_names_the_failing_node_as_srun_does(tmp_path):
    """srun names a failing task's node by its Slurm name, which is the inventory name."""
    driver = slurm.driver_script(slurm_plan("single"))
    start = driver.index('  errors="$(grep')
    end = driver.index("\nfi\nexit ")
    snippet = "a=attempts/0\nfinal=FAILED\nfailed_job=7\nfield() { :; }\nrec=\n" + driver[start:end] + "\n"
    (tmp_path / "attempts" / "0").mkdir(parents=True)  # Slurm's output: in the attempt's folder
    (tmp_path / "attempts" / "0" / "slurm-7.out").write_text(
        "srun: error: alpha: task 0: Killed\nsrun: error: w2: tasks 1-2: Exited with exit code 3\n")
    out = subprocess.run(["bash", "-c", snippet], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.startswith("DISTRUN_FAILED_HOST w2 Slurm job 7 ended FAILED on w2:"), out


def _fake_hostname(tmp_path: Path, short: str, addresses: str) -> dict[str, str]:
    """A PATH whose `hostname` answers like the given machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "hostname"
    fake.write_text(f'#!/bin/sh\ncase "$1" in -I) echo "{addresses} ";; *) echo {short};; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_rank_wrapper_finds_its_inventory_name_on_a_machine_with_another_hostname(tmp_path):
    plan = plan_for(cluster(), run_id="r1")
    wrapper = render_rank_wrapper(plan).replace(f"cd {plan.run_dir}", f"cd {tmp_path}")
    cases = {("node2", "172.17.0.5 10.0.0.12"): "w2",    # found by its inventory address
             ("w3", "192.168.1.9"): "w3",                 # found by its name (a DNS-named ansible_host)
             ("elsewhere", "192.168.1.10"): "elsewhere"}  # not in the plan: its own hostname
    for (short, addresses), expected in cases.items():
        env = _fake_hostname(tmp_path, short, addresses)
        out = subprocess.run(["bash", "-c", wrapper, "bash", "printenv", "DISTRUN_HOST"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        header, value = out.stdout.splitlines()[:2]
        assert value == expected
        assert f" host={expected} machine={short} " in header


def test_the_summary_names_a_failing_rank_by_its_inventory_name():
    lines = ["DISTRUN_RANK rank=1 local_rank=0 world_size=3 host=w2 machine=node2 pid=7",
             "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD"]
    assert first_failure(lines, LAUNCHERS["mpirun"]) == "; first failing rank 1 on w2"


def test_every_rank_learns_how_many_ranks_its_node_runs(tmp_path):
    # w2 has 2 slots, alpha and w3 one: LOCAL_WORLD_SIZE as torchrun would set it, under mpirun
    # and srun too (they do not set it), unless the launcher already did.
    plan = plan_for(cluster(), run_id="r1")
    assert {h.name: h.slots for h in plan.placement.hosts} == {"alpha": 1, "w2": 2, "w3": 1}
    wrapper = render_rank_wrapper(plan).replace(f"cd {plan.run_dir}", f"cd {tmp_path}")
    cases = {("node2", "10.0.0.12", ()): "2", ("node3", "10.0.0.13", ()): "1",
             ("node2", "10.0.0.12", (("OMPI_COMM_WORLD_LOCAL_SIZE", "5"),)): "5",
             ("node2", "10.0.0.12", (("LOCAL_WORLD_SIZE", "7"),)): "7"}
    for (short, addresses, extra), expected in cases.items():
        env = {**_fake_hostname(tmp_path, short, addresses), **dict(extra)}
        out = subprocess.run(["bash", "-c", wrapper, "bash", "printenv", "LOCAL_WORLD_SIZE"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[1] == expected, (short, extra, out.stdout)


def test_without_a_planned_interface_a_hostname_on_loopback_gives_the_default_routes_interface(tmp_path):
    # A Slurm distrun does not administer: no facts, no planned interface. Debian's installer put
    # the hostname on 127.0.1.1, so Gloo would tell the other ranks to call this node there.
    plan = plan_for(cluster(), run_id="r1")
    wrapper = render_rank_wrapper(plan).replace(f"cd {plan.run_dir}", f"cd {tmp_path}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"ip": 'echo "default via 10.0.0.1 dev ens7 proto static"',
                       "getent": 'echo "$FAKE_ADDR     STREAM elsewhere"'}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    for addr, expected in (("127.0.1.1", "ens7"), ("10.0.0.99", "")):
        env = {**_fake_hostname(tmp_path, "elsewhere", "10.0.0.99"), "FAKE_ADDR": addr}
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
        env.pop("GLOO_SOCKET_IFNAME", None)
        out = subprocess.run(["bash", "-c", wrapper, "bash", "sh", "-c", 'echo "${GLOO_SOCKET_IFNAME:-}"'], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[1] == expected, (addr, out.stdout)
