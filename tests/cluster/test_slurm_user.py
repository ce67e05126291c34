"""A Slurm cluster the user does not administer: the Slurm test cluster seen by an ordinary user.

The admin's Slurm is the shared cluster's (the test inventory sets ``slurm_enabled: true``, so
the first setup installed it; test_slurm.py tests it as the admin). The test prepares, as a site
would and not through distrun: a user ``alice`` with the same uid on every node, who logs in to
node1 with a key; her folder on the site's shared filesystem (the host folder bound at
/mnt/site in every node, the same filesystem on all three); her own venv there. Her venv layers
the site's software stack (the cluster's /opt/distrun/venv, present on every node, through a
.pth file), as a site's module system does, so it has mpi4py and torch without a 200 MB install.
Then a second inventory, the login node (node1) only, as alice, never becoming anyone, drives
distrun; `distrun setup` never runs on it.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.harness import matrix

from .conftest import CliResult, distrun, rank_headers, run_processes

USER, UID = "alice", 2345
FOLDER = f"{matrix.SITE_MOUNT}/{USER}"
VENV = f"{FOLDER}/venv"
SHARED = f"{FOLDER}/distrun"
SITE_STACK = "/opt/distrun/venv"
FAIL_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from mpi4py import MPI
    time.sleep(float(os.environ.get("SLEEP", "0")))
    if MPI.COMM_WORLD.Get_rank() == int(os.environ.get("FAIL_RANK", "-1")):
        sys.exit(3)
    MPI.COMM_WORLD.Barrier()
""")


def _show(result: CliResult) -> str:
    return result.stdout[-5000:] + result.stderr[-2000:]


def _prepare_user(cluster) -> None:
    """alice on every node (same uid), her key on node1, her folder and venv on the shared filesystem."""
    for k in (1, 2, 3):
        cluster.exec(k, f"id {USER} >/dev/null 2>&1 || useradd --create-home --uid {UID} --shell /bin/bash {USER}")
    pub = cluster.key.with_suffix(".pub").read_text()
    cluster.exec(1, f"set -e; install -d -o {USER} -g {USER} -m 0700 /home/{USER}/.ssh; "
                    f"install -o {USER} -g {USER} -m 0600 /dev/stdin /home/{USER}/.ssh/authorized_keys; "
                    f"install -d -o {USER} -g {USER} -m 0755 {FOLDER}", input=pub)
    lib = cluster.exec(1, f"ls -d {SITE_STACK}/lib/python3.*/site-packages").stdout.strip()
    cluster.exec(1, f"set -e; [ -x {VENV}/bin/python ] || runuser -u {USER} -- python3 -m venv {VENV}; "
                    f"runuser -u {USER} -- sh -c 'echo {lib} > \"$(ls -d {VENV}/lib/python3.*/site-packages)/site-stack.pth\"'")
    for k in (2, 3):  # the same folder, seen from the compute nodes
        cluster.exec(k, f"runuser -u {USER} -- {VENV}/bin/python -c 'import mpi4py, torch'")


@pytest.fixture(scope="module")
def site(provisioned, tmp_path_factory):
    """(cluster, the user's inventory): only node1, as alice, never becoming anyone."""
    assert provisioned.exec(1, "sinfo --noheader", check=False).returncode == 0, "the admin's Slurm is not up"
    _prepare_user(provisioned)
    admin = yaml.safe_load(Path(provisioned.inventory).read_text())["all"]["vars"]
    inv = tmp_path_factory.mktemp("slurm-user-inventory") / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {
            "ansible_user": USER, "ansible_become": False,
            **{k: admin[k] for k in ("ansible_ssh_private_key_file", "ansible_ssh_common_args",
                                     "ansible_python_interpreter", "ansible_host_key_checking")},
            "distrun_slurm_existing": True, "distrun_user": USER, "distrun_env_prefix": VENV,
            "distrun_shared_dir": SHARED, "slurm_partition": "distrun", "slurm_nodes": 3,
        },
        "children": {"head": {"hosts": {"node1": {"ansible_host": provisioned.ip(1)}}}},
    }}))
    yield provisioned, inv
    provisioned.exec(1, f"scancel -u {USER}; true", check=False)


def _make_folder(cluster) -> None:
    """What the check's fix tells her to do: her folder for distrun, as herself."""
    cluster.exec(1, f"runuser -u {USER} -- mkdir -p {SHARED}")


def test_setup_refuses_the_users_inventory_and_check_reads_slurm_and_her_env(site):
    cluster, inv = site
    refused = distrun("setup", "--inventory", str(inv))
    assert refused.rc == 2, _show(refused)
    assert "distrun installs nothing on a Slurm cluster it does not administer" in refused.stderr
    assert refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1, _show(refused)
    # Her folder for distrun does not exist yet: check says so, and what she can do about it.
    cluster.exec(1, f"rm -rf {SHARED}")
    missing = distrun("check", "--inventory", str(inv), "--json")
    assert missing.rc == 1, _show(missing)
    item = json.loads(missing.stdout)["checks"]["shared folder"]["node1"]
    assert item["detail"] == f"{SHARED} does not exist"
    assert item["fix"].startswith(f"create it as you on node1 (mkdir -p {SHARED})"), item
    _make_folder(cluster)
    result = distrun("check", "--inventory", str(inv), "--json")
    assert result.rc == 0, _show(result)
    report = json.loads(result.stdout)
    assert list(report["hosts"]) == ["node1"]
    assert report["checks"]["slurm"]["node1"]["detail"] == "sinfo answers: partition distrun up, 3 node(s) idle"
    assert report["checks"]["env"]["node1"]["detail"] == f"{VENV}/bin/python"
    assert "ports" not in report["checks"]


def test_ddp_runs_to_completed_as_the_user_and_a_failing_rank_names_its_node(site, distrun_home, tmp_path):
    cluster, inv = site
    _make_folder(cluster)
    result = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--workload", "ddp", "--epochs", "2")
    assert result.rc == 0, _show(result)
    assert "DISTRUN_SLURM_RESULT state=COMPLETED" in result.stdout
    job = re.search(r"submitted job.sbatch as job (\d+)", result.stdout)[1]
    assert f"UserId={USER}({UID})" in cluster.exec(1, f"scontrol show job -o {job}").stdout
    run = matrix.latest_run(distrun_home)
    ranks = rank_headers(run)
    assert sorted(world for world, _, _ in ranks.values()) == [3, 3, 3], ranks
    assert sorted(machine for _, _, machine in ranks.values()) == ["node1", "node2", "node3"], ranks
    assert json.loads((run / "plan.json").read_text())["login"]["name"] == "node1"
    logs = distrun("logs", run.name, "--rank", "2")
    assert logs.rc == 0 and "DISTRUN_RANK rank=2 " in logs.stdout, _show(logs)

    script = tmp_path / "fail.py"
    script.write_text(FAIL_SCRIPT)
    failed = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--skip-preflight",
                     "--script", str(script), "--env", "FAIL_RANK=1")
    assert failed.rc == 1, _show(failed)
    assert "DISTRUN_SLURM_RESULT state=FAILED" in failed.stdout
    node = rank_headers(matrix.latest_run(distrun_home))[1][2]
    assert re.search(rf"failed \(launcher exit 1\).*{node}", " ".join(failed.stdout.split())), _show(failed)
    assert cluster.exec(1, f"squeue --noheader --user {USER}").stdout.strip() == ""


def test_mpirun_is_refused_on_the_users_inventory_before_anything_runs(site, distrun_home):
    _, inv = site
    before = sorted((distrun_home / "runs").glob("*-train-*"))
    refused = distrun("train", "--inventory", str(inv), "--launcher", "mpirun", "--workload", "ddp")
    assert refused.rc == 2, _show(refused)
    assert "run jobs there with --launcher slurm" in refused.stderr, _show(refused)
    assert sorted((distrun_home / "runs").glob("*-train-*")) == before


def test_a_detached_job_is_stopped_by_the_user_and_nothing_of_it_is_left(site, distrun_home, tmp_path):
    cluster, inv = site
    _make_folder(cluster)
    script = tmp_path / "sleepy.py"
    script.write_text(FAIL_SCRIPT)
    started = distrun("train", "--inventory", str(inv), "--launcher", "slurm", "--skip-preflight", "--detach",
                      "--script", str(script), "--env", "SLEEP=300")
    assert started.rc == 0, _show(started)
    run_id = matrix.latest_run(distrun_home).name
    jobs = cluster.exec(1, f"squeue --noheader --user {USER} --format=%i").stdout.split()
    assert len(jobs) == 1, jobs
    stopped = distrun("stop", run_id)
    assert stopped.rc == 0, _show(stopped)
    assert "JobState=CANCELLED" in cluster.exec(1, f"scontrol show job -o {jobs[0]}").stdout
    assert cluster.exec(1, f"squeue --noheader --user {USER}").stdout.strip() == ""
    assert run_processes(cluster, run_id) == []
