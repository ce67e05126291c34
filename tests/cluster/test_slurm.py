"""Slurm on the provisioned 3-node cluster: the role, then `distrun train --launcher slurm` to its ends.

The test inventory sets ``slurm_enabled: true``, so the shared cluster's first setup installs
Slurm, and the second converge (changed=0, test_hostile_setup.py) and check mode cover the role's
idempotence with the rest of setup.yml. These tests read the role's result through a copy of that
inventory (the same hosts and ``inventory/test/group_vars``) and run in file order: Slurm's state,
a completed training, a failing rank, a cancelled job.
"""

from __future__ import annotations

import re
import shutil
import signal
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import REPO, CliResult, distrun, rank_headers, run_processes, start_distrun

FAIL_SCRIPT = textwrap.dedent("""
    import os, socket, sys, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    print(f"SCRIPT rank={comm.Get_rank()} host={socket.gethostname()}", flush=True)
    if os.environ.get("SLEEP"):
        time.sleep(float(os.environ["SLEEP"]))
    if comm.Get_rank() == int(os.environ.get("FAIL_RANK", "-1")):
        sys.exit(3)
    comm.Barrier()
""")


@pytest.fixture(scope="module")
def slurm_cluster(provisioned, tmp_path_factory, distrun_home):
    inv_dir = tmp_path_factory.mktemp("slurm-inventory")
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", inv_dir / "group_vars")
    assert "\nslurm_enabled: true\n" in (inv_dir / "group_vars" / "all.yml").read_text()
    shutil.copy(provisioned.inventory, inv_dir / "hosts.yml")
    return provisioned, inv_dir / "hosts.yml"


def _runs(home: Path) -> list[Path]:
    return sorted((home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)


def _show(result: CliResult) -> str:
    return result.stdout[-5000:] + result.stderr[-2000:]


def test_setup_brings_up_slurm_with_three_idle_nodes(slurm_cluster):
    cluster, _ = slurm_cluster
    sinfo = cluster.exec(1, "sinfo --noheader --Node --format='%N %t %c'").stdout.split("\n")
    states = {line.split()[0]: line.split()[1] for line in sinfo if line.strip()}
    assert states == {"node1": "idle", "node2": "idle", "node3": "idle"}, sinfo
    for k in (1, 2, 3):
        key = cluster.exec(k, "stat -c '%a %U' /etc/munge/munge.key && md5sum < /etc/munge/munge.key").stdout.split("\n")
        assert key[0] == "400 munge"
        assert key[1] == cluster.exec(1, "md5sum < /etc/munge/munge.key").stdout.split("\n")[0], f"node{k} has another key"
    assert cluster.exec(2, "systemctl is-active slurmd").stdout.strip() == "active"
    assert cluster.exec(1, "systemctl is-active slurmctld").stdout.strip() == "active"


def test_train_ddp_under_slurm_completes_on_three_nodes(slurm_cluster, distrun_home):
    cluster, inv = slurm_cluster
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--workload", "ddp", "--epochs", "3")
    assert result.rc == 0, _show(result)
    assert "DISTRUN_SLURM_RESULT state=COMPLETED" in result.stdout
    # The job's state as Slurm reports it (PENDING, or already RUNNING when it starts at once).
    assert re.search(r"DISTRUN_SLURM job \d+ [A-Z_]+ reason=", result.stdout), "queue state not shown"
    assert "epoch 3/3" in result.stdout, "rank 0's progress was not streamed"
    ranks = {r: (world, host) for r, (world, host, _) in rank_headers(_runs(distrun_home)[-1]).items()}
    assert ranks == {0: (3, "node1"), 1: (3, "node2"), 2: (3, "node3")}, ranks
    # The munge key is in no run record.
    key = cluster.exec(1, "base64 -w0 /etc/munge/munge.key").stdout.strip()
    assert key
    for f in distrun_home.rglob("*"):
        if f.is_file():
            assert key not in f.read_text(errors="replace"), f"munge key found in {f}"


def test_multi_job_mode_runs_one_job_per_node_with_the_first_as_master(slurm_cluster, distrun_home):
    """The seed page's pattern for sites that allow only single-node jobs: one job per node,
    the first one's node is MASTER_ADDR for the others' torchrun."""
    cluster, inv = slurm_cluster
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--slurm-mode", "multi-job",
                     "--workload", "ddp", "--epochs", "3")
    assert result.rc == 0, _show(result)
    assert "DISTRUN_SLURM_RESULT state=COMPLETED" in result.stdout, _show(result)
    run = _runs(distrun_home)[-1]
    sbatch = sorted({p.name for p in (run / "nodes").rglob("job-*.sbatch")})  # every node holds the run's files
    assert sbatch == ["job-0.sbatch", "job-1.sbatch", "job-2.sbatch"], sbatch
    ranks = {r: (world, host) for r, (world, host, _) in rank_headers(run).items()}
    assert ranks == {0: (3, "node1"), 1: (3, "node2"), 2: (3, "node3")}, ranks
    assert cluster.exec(1, "squeue --noheader").stdout.strip() == ""


def test_failing_rank_gives_non_zero_exit_naming_the_node(slurm_cluster, tmp_path):
    cluster, inv = slurm_cluster
    script = tmp_path / "fail.py"
    script.write_text(FAIL_SCRIPT)
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--skip-preflight",
                     "--script", str(script), "--env", "FAIL_RANK=1")
    assert result.rc == 1, _show(result)
    assert "DISTRUN_SLURM_RESULT state=FAILED" in result.stdout, _show(result)
    assert re.search(r"failed \(launcher exit 1\).*node2", " ".join(result.stdout.split())), _show(result)
    assert cluster.exec(1, "squeue --noheader").stdout.strip() == ""


def test_interrupt_cancels_the_job_and_leaves_nothing_running(slurm_cluster, distrun_home, tmp_path):
    cluster, inv = slurm_cluster
    script = tmp_path / "sleepy.py"
    script.write_text(FAIL_SCRIPT)
    log = tmp_path / "cli.log"
    with log.open("w") as out:
        proc = start_distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--skip-preflight",
                             "--script", str(script), "--env", "SLEEP=300", log=out)
        try:
            deadline = time.monotonic() + 180
            while "RUNNING" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(1)
            assert "RUNNING" in log.read_text(), log.read_text()[-4000:]
            time.sleep(2)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc == 130, log.read_text()[-4000:]
    job_id = re.search(r"submitted job.sbatch as job (\d+)", log.read_text())[1]
    state = cluster.exec(1, f"scontrol show job -o {job_id}").stdout
    assert "JobState=CANCELLED" in state, state
    assert cluster.exec(1, "squeue --noheader").stdout.strip() == ""
    run_id = _runs(distrun_home)[-1].name
    assert run_processes(cluster, run_id) == []
