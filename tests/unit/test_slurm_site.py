"""A Slurm cluster distrun does not administer: the login-node inventory, the job it submits, what
it refuses, and the preflight's words there (no host contacted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.errors import InventoryError, UserError
from distrun.inventory.cluster import load_cluster
from distrun.launchers import launcher_named, slurm
from distrun.planning.bundle import run_vars
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.preflight import judge
from distrun.preflight import report as judge_report
from distrun.store.runs import new_run

from .conftest import REPO, distrun_bin
from .plans import plan_for as planned
from .probe_text import probe_text

PROBE = REPO / "roles" / "preflight" / "files" / "probe.py"

LOGIN_ONLY = """
all:
  vars:
    distrun_slurm_existing: true
    ansible_user: alice
    ansible_become: false
    distrun_user: alice
    distrun_env_prefix: /home/alice/venv
    distrun_shared_dir: /home/alice/distrun
    {extra}
  children:
    head:
      hosts:
        login1: {{ansible_host: 10.1.0.5}}
"""


def site(write_inventory, extra: str = "", hosts_extra: str = "") -> Path:
    return write_inventory(LOGIN_ONLY.format(extra=extra) + hosts_extra)


def plan_for(cluster, **kw):
    return planned(cluster, run_id="r1", launcher="slurm", workload="ddp", **kw)


def test_login_only_inventory_reaches_the_login_node_alone_and_asks_slurm_for_nodes(write_inventory):
    cluster = load_cluster(site(write_inventory, "slurm_nodes: 3"))
    assert cluster.site == "slurm"
    assert [n.name for n in cluster.nodes] == ["login1"]
    assert len(cluster.workers) == 3 and cluster.total_slots == 3
    plan = plan_for(cluster)
    assert plan.placement.head.name == "login1" and plan.placement.reached_hosts == ()
    script = slurm.sbatch_script(plan)
    assert "#SBATCH --nodes=3" in script and "#SBATCH --ntasks=3" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "--nodelist" not in script  # Slurm picks the nodes
    assert "distrun-node-check /home/alice/distrun/runs/r1/rank-env.sh" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # The driver runs on the login node; nothing is staged, followed or collected elsewhere.
    assert list(launch_scripts(plan)) == ["login1"]
    assert "hostfile" not in plan_files(plan)
    extravars = run_vars(plan, new_run("train", Path("inv")), plan_files(plan), launch_scripts(plan), script=None,
                         env={}, network=None, preflight=True)
    assert extravars["distrun_rank_hosts"] == []


def test_named_compute_nodes_become_the_nodelist_with_the_site_options(write_inventory):
    extra = ("slurm_nodelist: [g1001, g1002]\n    slurm_tasks_per_node: 8\n    slurm_gpus_per_node: 8\n"
             "    slurm_cpus_per_task: 8\n    slurm_partition: gpu1")
    cluster = load_cluster(site(write_inventory, extra))
    script = slurm.sbatch_script(plan_for(cluster, np=12))
    for line in ("--partition=gpu1", "--nodes=2", "--nodelist=g1001,g1002", "--ntasks=12", "--ntasks-per-node=8",
                 "--cpus-per-task=8", "--gpus-per-node=8"):
        assert f"#SBATCH {line}\n" in script, line
    assert "SLURM_HOSTFILE" not in script  # uneven (8 + 4): Slurm places them, no hostfile


@pytest.mark.parametrize(("extra", "hosts_extra", "says"), [
    ("", "    workers:\n      hosts:\n        c1: {}\n", "remove c1 from group workers and name compute nodes in slurm_nodelist"),
    ("slurm_nodes: 0", "", "slurm_nodes=0; set it to a whole number >= 1"),
    ("slurm_nodelist: ['-oProxyCommand=x']", "", "is not a plain name"),
])
def test_a_bad_site_inventory_is_one_line_naming_the_fix(write_inventory, extra, hosts_extra, says):
    with pytest.raises(InventoryError, match="inventory .*hosts.yml") as exc:
        load_cluster(site(write_inventory, extra, hosts_extra))
    assert says in str(exc.value)


@pytest.mark.parametrize(("old", "new", "says"), [
    ("ansible_become: false", "ansible_become: true", "set ansible_become: false"),
    ("    ansible_become: false\n", "", "set ansible_become: false"),
    ("distrun_user: alice", "distrun_user: distrun", "ansible_user=alice, distrun_user=distrun"),
])
def test_the_site_inventory_must_log_in_as_the_user_and_never_become(write_inventory, old, new, says):
    with pytest.raises(InventoryError) as exc:
        load_cluster(write_inventory(LOGIN_ONLY.format(extra="").replace(old, new)))
    assert says in str(exc.value)


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_only_slurm_starts_ranks_on_a_site_slurm(write_inventory, launcher):
    cluster = load_cluster(site(write_inventory))
    launcher_named("slurm").require_ready(cluster)
    with pytest.raises(UserError, match="does not administer .*run jobs there with --launcher slurm"):
        launcher_named(launcher).require_ready(cluster)


def test_setup_refuses_a_site_slurm_in_one_line_and_touches_nothing(write_inventory, cli_env):
    inv = site(write_inventory)
    out = subprocess.run([distrun_bin(), "setup", "--inventory", str(inv)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"distrun: error: inventory {inv}: distrun_slurm_existing is true: distrun installs nothing on a Slurm cluster "
        f"it does not administer; run 'distrun check --inventory {inv}' to verify your env, then "
        f"'distrun train --inventory {inv} --launcher slurm'"]
    assert not (Path(cli_env["DISTRUN_HOME"]) / "runs").exists() or not any((Path(cli_env["DISTRUN_HOME"]) / "runs").iterdir())


def test_hostfile_refuses_a_site_slurm_in_one_line(write_inventory, cli_env):
    inv = site(write_inventory)
    out = subprocess.run([distrun_bin(), "hostfile", "--inventory", str(inv)], capture_output=True, text=True,
                         env=cli_env, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"distrun: error: inventory {inv}: distrun_slurm_existing is true: Slurm places the ranks there and there is "
        f"no MPI hostfile; 'distrun train --inventory {inv} --launcher slurm --dry-run' shows the job it would submit"]


def test_site_fixes_name_the_users_env_never_distrun_setup():
    probes = {"login1": {"host": "login1", "setup": {"ok": False, "detail": "distrun never set up login1: no env /home/a/v"}}}
    report = judge.verdict(probes, head="login1", shared_mode="sync", shared_dir="/home/a/d", setup="distrun setup -i x",
                           site=True, env_prefix="/home/a/v")
    item = report["setup"]["login1"]
    assert item.detail == "no env /home/a/v on login1"
    assert item.fix.startswith("create your env at /home/a/v") and "distrun setup" not in item.fix
    probes = {"login1": {"host": "login1", "setup": {"ok": True}, "env": {"ok": True, "detail": "/home/a/v/bin/python"},
                         "mpi4py": {"ok": True, "detail": "ok"},
                         "needs": {"module torch": {"ok": False, "detail": "not in /home/a/v"}},
                         "slurm": {"ok": False, "kind": "sinfo", "detail": "sinfo failed as alice: Unable to contact"}}}
    report = judge.verdict(probes, head="login1", shared_mode="sync", shared_dir="/home/a/d", setup="distrun setup -i x",
                           site=True, env_prefix="/home/a/v")
    assert report["needs"]["login1"].fix == "install torch into your env: /home/a/v/bin/python -m pip install torch"
    assert report["slurm"]["login1"].detail == "sinfo failed as alice: Unable to contact"
    assert "ask the site's admins" in report["slurm"]["login1"].fix
    assert "distrun setup" not in judge_report.refusal(report)


def _fake_slurm(bin_dir: Path, sinfo: str) -> None:
    bin_dir.mkdir()
    for prog in ("sbatch", "srun", "squeue", "scontrol", "scancel"):
        (bin_dir / prog).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\n{sinfo}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)


@pytest.mark.parametrize(("sinfo", "partition", "expect"), [
    ("printf 'debug* up 3 idle\\nbig up 2 alloc\\nbig up 1 idle\\n'", "big",
     {"ok": True, "detail": "sinfo answers: partition big up, 3 node(s) alloc/idle"}),
    ("printf 'debug* up 3 idle\\n'", "gpu1",
     {"ok": False, "kind": "partition", "detail": "partition gpu1 is not in sinfo (partitions: debug)"}),
    ("echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1", "",
     {"ok": False, "kind": "sinfo", "detail": "sinfo failed as root: sinfo: error: Unable to contact slurm controller "
                                              "(connect failure)"}),
])
def test_the_probe_reads_sinfo_on_the_users_path(tmp_path, sinfo, partition, expect):
    _fake_slurm(tmp_path / "bin", sinfo)
    cfg = {"host": "here", "user": "root", "env_prefix": sys.prefix, "mpi_prefix": "/usr", "shared_dir": str(tmp_path),
           "slurm": True, "slurm_partition": partition}
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(cfg)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1])["slurm"] == expect


def test_the_probe_names_the_slurm_commands_missing_from_path(tmp_path):
    cfg = {"host": "here", "user": "root", "env_prefix": sys.prefix, "mpi_prefix": "/usr", "shared_dir": str(tmp_path),
           "slurm": True}
    env = {**os.environ, "PATH": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(cfg)], capture_output=True, text=True,
                         env=env, timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])["slurm"]
    # The probe also looks in the usual folders, whatever PATH says.
    absent = [p for p in ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
              if not any(os.path.exists(f"{d}/{p}") for d in (f"{sys.prefix}/bin", "/usr/local/bin", "/usr/bin", "/bin"))]
    assert absent, "this machine has every Slurm command: the test cannot hide them"
    assert found == {"ok": False, "kind": "programs", "detail": f"{', '.join(absent)} not found on PATH for root"}


def test_a_missing_folder_on_a_site_slurm_is_created_by_the_user_as_the_fix_says():
    probes = {"login1": {"host": "login1", "setup": {"ok": True}, "env": {"ok": True, "detail": "/home/a/v/bin/python"},
                         "mpi4py": {"ok": True, "detail": "ok"},
                         "shared_writable": {"ok": False, "detail": "/home/a/d does not exist"}}}
    report = judge.verdict(probes, head="login1", shared_mode="sync", shared_dir="/home/a/d", setup="distrun setup -i x",
                           site=True, env_prefix="/home/a/v")
    item = report["shared folder"]["login1"]
    assert item.detail == "/home/a/d does not exist"
    assert item.fix.startswith("create it as you on login1 (mkdir -p /home/a/d)")
    assert "distrun setup" not in judge_report.refusal(report)
