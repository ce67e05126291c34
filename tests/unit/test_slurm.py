"""Slurm without a cluster: states to exit codes, sbatch scripts for each mode, the driver, the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from distrun.errors import UserError
from distrun.inventory.cluster import cluster_from_json
from distrun.launchers import slurm
from distrun.launchers.slurm import multi_job_script, sbatch_files, sbatch_script, slurm_hostfile
from distrun.planning.run_files import plan_files
from distrun.transport.rundir import WRAPPER

from .conftest import REPO, distrun_bin
from .plans import plan_for as planned

HOSTS = {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}, "n3": {"ansible_host": "10.0.0.3"}}
ENABLED = {"slurm_enabled": True}


def cluster(hosts=None, fact_cache=None, **gv):
    hosts = hosts or HOSTS
    data = {
        "_meta": {"hostvars": {h: {**gv, **hv} for h, hv in hosts.items()}},
        "all": {"children": ["head", "workers"]},
        "head": {"hosts": ["n1"]},
        "workers": {"hosts": list(hosts)},
    }
    return cluster_from_json(Path("/inv/hosts.yml"), data, fact_cache)


def plan_for(c, mode=None, **kw):
    return planned(c, run_id="r1", launcher="slurm", slurm={"mode": mode} if mode else None, **kw)


@pytest.mark.parametrize(("state", "code"), [
    ("COMPLETED", 0), ("FAILED", 1), ("TIMEOUT", 124), ("DEADLINE", 124), ("CANCELLED", 130),
    ("CANCELLED by 1000", 130), ("CANCELLED+", 130), ("OUT_OF_MEMORY", 137), ("PREEMPTED", 143),
    ("NODE_FAIL", 255), ("BOOT_FAIL", 255), ("SPECIAL_EXIT", 1), ("", 1), ("failed", 1),
])
def test_final_state_maps_to_exit_code(state, code):
    assert slurm.exit_code(state) == code


def test_driver_maps_states_with_the_same_table():
    """The bash case in the driver is generated from STATE_EXIT: run it for every state."""
    script = slurm.driver_script(plan_for(cluster(**ENABLED)))
    func = script[script.index("exit_code_of() {"):script.index("jobs=()")]
    states = [*slurm.STATE_EXIT, "WHATEVER"]
    out = subprocess.run(["bash", "-c", func + "".join(f"exit_code_of {s}\n" for s in states)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in out] == [slurm.exit_code(s) for s in states]


@pytest.mark.parametrize("mode", ["single", "multi-job"])
def test_driver_is_valid_bash_and_free_of_jinja_markers(mode):
    # Ansible templates extravars: '{{', '{%' or '{#' in a rendered file would break staging.
    c = cluster(**ENABLED)
    plan = plan_for(c, mode)
    files = {**sbatch_files(plan), **slurm.driver_files(plan)}
    for name, text in files.items():
        for marker in ("{{", "{%", "{#"):
            assert marker not in text, f"{name} holds {marker}"
        if name.endswith((".sh", ".sbatch")):
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "trap cancel INT TERM HUP" in files["slurm-driver.sh"]
    assert "scancel" in files["slurm-driver.sh"]


def test_cpu_job_one_rank_per_slot_srun_pmix_and_no_gres():
    script = sbatch_script(plan_for(cluster(**ENABLED, slurm_partition="batch", slurm_time_limit="00:30:00")))
    assert "#SBATCH --job-name=distrun-r1" in script
    assert "#SBATCH --nodes=3" in script
    assert "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --nodelist=n1,n2,n3" in script
    assert "#SBATCH --partition=batch" in script
    assert "#SBATCH --time=00:30:00" in script
    assert "--gres" not in script
    assert "srun --mpi=pmix --kill-on-bad-exit=1 --output=/srv/distrun/runs/r1/attempts/0/ranks/%t/stdout" in script
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    assert "#SBATCH --output=/srv/distrun/runs/r1/attempts/0/slurm-%j.out" in script
    assert "mkdir -p attempts/0/ranks/0 attempts/0/ranks/1 attempts/0/ranks/2" in script


def test_gpu_nodes_get_gpus_per_node_from_the_distrun_fact(tmp_path):
    for host in HOSTS:
        facts = {"ansible_local": {"distrun": {"gpus": 4}}}
        (tmp_path / f"s1_{host}").write_text(json.dumps({"__payload__": json.dumps(facts)}))
    c = cluster(fact_cache=tmp_path, **ENABLED)
    plan = plan_for(c)
    script = sbatch_script(plan)
    assert "#SBATCH --gpus-per-node=4" in script and "--gres" not in script
    assert "#SBATCH --ntasks-per-node=4" in script  # slots from the GPUs
    # The ranks' step asks for them too; Slurm picks which, and sets CUDA_VISIBLE_DEVICES itself.
    assert " --gpus-per-node=4 " in script.splitlines()[-1] and "CUDA_VISIBLE_DEVICES" not in plan_files(plan)[WRAPPER]
    multi = multi_job_script(plan_for(c, "multi-job"), 1, plan.placement.hosts[1])
    assert "#SBATCH --gpus-per-node=4" in multi


def test_uneven_slots_place_ranks_with_an_arbitrary_distribution():
    hosts = {h: {**v, "slots": s} for (h, v), s in zip(HOSTS.items(), (2, 1, 3), strict=True)}
    plan = plan_for(cluster(hosts, **ENABLED))
    files = sbatch_files(plan)
    script = files["job.sbatch"]
    assert "#SBATCH --ntasks=6" in script
    assert "#SBATCH --distribution=arbitrary" in script
    assert "--ntasks-per-node=2" not in script.replace("srun --ntasks-per-node=1", "")
    assert files["slurm-hostfile"] == slurm_hostfile(plan) == "n1\nn1\nn2\nn3\nn3\nn3\n"
    # The step that makes the rank folders runs once on every node, whatever the job's
    # distribution: with the submission's SLURM_HOSTFILE, srun followed the hostfile's first
    # lines (n1, n1, n2) and left n3 without its folders.
    assert "env -u SLURM_HOSTFILE srun --ntasks-per-node=1 --ntasks=3 --distribution=block mkdir -p attempts/0/ranks/0" in script
    assert "export SLURM_HOSTFILE=/srv/distrun/runs/r1/slurm-hostfile" in slurm.driver_script(plan)


def test_multi_job_mode_master_first_then_workers_with_its_node():
    plan = plan_for(cluster(**ENABLED, slurm_mode="multi-job"))
    files = sbatch_files(plan)
    assert sorted(files) == ["job-0.sbatch", "job-1.sbatch", "job-2.sbatch"]
    master, worker = files["job-0.sbatch"], files["job-2.sbatch"]
    assert "#SBATCH --job-name=distrun-r1-0" in master and "#SBATCH --nodelist=n1" in master
    assert 'export MASTER_ADDR="$SLURMD_NODENAME"' in master
    assert "#SBATCH --nodelist=n3" in worker
    assert ': "${MASTER_ADDR:?' in worker
    for text in (master, worker):
        assert "#SBATCH --nodes=1" in text
        assert '--nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR":29500' in text
        assert "-m mpi4py" not in text  # separate jobs form no MPI world
    # The master job's agent starts the rendezvous store; the workers' agents only join it.
    assert "--rdzv-conf=is_host=1" in master and "is_host=0" not in master
    assert "--rdzv-conf=is_host=0" in worker and "is_host=1" not in files["job-1.sbatch"] + worker
    driver = slurm.driver_script(plan)
    assert 'submit "$script" --export="ALL,MASTER_ADDR=$master"' in driver
    assert "for script in job-1.sbatch job-2.sbatch" in driver


def test_settings_and_refusals():
    assert slurm.settings(cluster(**ENABLED)) == {"mode": "single", "mpi": "pmix"}
    assert slurm.settings(cluster(**ENABLED, slurm_mode="multi-job"), "single")["mode"] == "single"
    with pytest.raises(UserError, match="slurm_mode 'both'"):
        slurm.settings(cluster(**ENABLED, slurm_mode="both"))
    slurm.Slurm().require_ready(cluster(slurm_enabled="true"))
    with pytest.raises(UserError, match=r"--launcher slurm needs Slurm.*slurm_enabled: true"):
        slurm.Slurm().require_ready(cluster())


def _cli(args, env, cwd=REPO):
    return subprocess.run([distrun_bin(), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_cli_dry_run_prints_the_script_and_a_real_run_needs_slurm_enabled(cli_env, write_inventory):
    hosts = ("all:\n  hosts:\n    n1: {ansible_host: 127.0.0.9}\n    n2: {ansible_host: 127.0.0.10}\n"
             "  children:\n    head: {hosts: {n1: }}\n    workers: {hosts: {n1: , n2: }}\n")
    off = write_inventory(hosts)
    dry = _cli(["train", "-i", str(off), "--launcher", "slurm", "--dry-run"], cli_env)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --nodes=2" in dry.stdout and "# /srv/distrun/runs/DRYRUN/slurm-driver.sh" in dry.stdout
    assert "note:        slurm_enabled is not true" in dry.stdout
    real = _cli(["train", "-i", str(off), "--launcher", "slurm"], cli_env)
    assert real.returncode == 2
    assert real.stderr.strip().count("\n") == 0 and "Traceback" not in real.stderr
    assert "distrun: error: inventory" in real.stderr and "slurm_enabled: true" in real.stderr
    on = write_inventory(hosts.replace("all:\n", "all:\n  vars: {slurm_enabled: true, slurm_mode: multi-job}\n"), "on.yml")
    multi = _cli(["train", "-i", str(on), "--launcher", "slurm", "--workload", "ddp", "--dry-run"], cli_env)
    assert multi.returncode == 0, multi.stderr
    assert "job-1.sbatch" in multi.stdout and "note:" not in multi.stdout


def test_rank_logs_name_the_rank_that_aborted_when_srun_killed_every_task(tmp_path):
    from distrun.launchers import LAUNCHERS
    from distrun.run.diagnosis import first_failure

    logs = {}
    for rank, host, body in ((0, "node1", "SCRIPT rank 0\n"),
                             (1, "node2", "SCRIPT rank 1\n----\nMPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 3.\n")):
        f = tmp_path / f"{rank}.stdout"
        f.write_text(f"DISTRUN_RANK rank={rank} local_rank=0 world_size=2 host={host} pid=1\n{body}")
        logs[rank] = f
    extra = slurm.rank_failure_lines(logs)
    assert extra == ["DISTRUN_RANK rank=1 local_rank=0 world_size=2 host=node2 pid=1",
                     "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD"]
    streamed = ["DISTRUN_FAILED_HOST node[1-2] Slurm job 2 ended FAILED (exit 3:0, reason NonZeroExitCode)"]
    assert first_failure(streamed + extra, LAUNCHERS["slurm"]) == "; first failing rank 1 on node2"


def test_a_task_that_never_starts_ends_the_job_and_names_its_node_and_cause(tmp_path):
    """srun reports a task it could not start and waits for it for ever (so do the ranks that did
    start): the driver cancels the job and says which node could not start it and why. Run with
    stand-ins for sbatch, scontrol and scancel that answer as Slurm 22.05 did on an sshfs mount
    without allow_other (capture: data/slurm/task-launch-failed.txt)."""
    plan = plan_for(cluster(**ENABLED))
    script = slurm.driver_script(plan).replace(f"cd {plan.run_dir}\n", f"cd {tmp_path}\n", 1)
    capture = Path(__file__).parent / "data" / "slurm" / "task-launch-failed.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        "sbatch": f"cp {capture} attempts/0/slurm-42.out; echo 42",  # --output: the attempt's folder
        "scontrol": 'if [ -e cancelled ]; then s=CANCELLED; else s=RUNNING; fi; '
                    'echo "JobId=42 JobState=$s Reason=None NodeList=n[1-3] ExitCode=0:0"',
        "scancel": "touch cancelled",
        "sacct": "true",
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "cancelled").exists(), proc.stdout  # the job did not wait for ever
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DISTRUN_SLURM_RESULT state=FAILED job=42" in proc.stdout
    assert ("DISTRUN_FAILED_HOST node2 Slurm could not start a task on node2 (srun: task 1 launch failed: Slurmd "
            "could not connect IO; slurmstepd: couldn't chdir to `/srv/distrun/runs/20261124-053444-train-6902': "
            "Permission denied: going to /tmp instead); the job was cancelled") in proc.stdout, proc.stdout
