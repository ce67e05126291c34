"""An attempt's files are its own (rundir.py): everything a launch script, a launcher and the rank
wrapper write lies in the attempt's folder, a launcher of a failed attempt that ends late writes
nothing the next attempt reads, and runs recorded before attempts had folders still read (until
store/retiring.py's READ_UNTIL)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from distrun.launchers import launcher_named
from distrun.launchers.torchrun import Torchrun
from distrun.planning import run_files
from distrun.planning.containers import Container
from distrun.planning.jobplan import to_json
from distrun.run import attempt_shell, liveness, starter
from distrun.run.diagnosis import rank_logs
from distrun.store.runs import Run, RunMeta
from distrun.transport import nodeprog, rundir

from .plans import plan_for
from .test_follow import plan_in, sh
from .test_launchers import MIXED, cluster

# What all attempts of a run share at the top of its run dir (rendered once per attempt, read only).
SHARED = {"hostfile", "rank-env.sh", "container-run.sh", "env.sh", "result.json", "slurm-hostfile", "slurm-driver.sh", "job.sbatch",
          "job-0.sbatch", "job-1.sbatch", "job-2.sbatch", "train.py"}


@pytest.mark.parametrize("image", [None, "localhost/train:1"])
@pytest.mark.parametrize(("launcher", "mode"), [("mpirun", ""), ("torchrun", ""), ("slurm", "single"), ("slurm", "multi-job")])
def test_every_path_an_attempt_writes_lies_in_its_own_folder(launcher, mode, image):
    plan = plan_for(cluster(MIXED), run_id="r1", launcher=launcher, restart=2, script="train.py",
                      slurm={"mode": mode} if mode else None, container=Container(image) if image else None)
    scripts = run_files.launch_scripts(plan)
    assert set(run_files.launch_files(plan, scripts)) == {f"attempts/2/launch-{h}.sh" for h in scripts}
    for text in scripts.values():
        assert f"cd {plan.run_dir}/attempts/2 || exit 3\n" in text
    texts = [*scripts.values(), *run_files.plan_files(plan).values(),
             *(" ".join(launcher_named(launcher).command(plan, h)) for h in plan.placement.hosts)]
    # Every path into the run dir names a shared file or this attempt's folder, never another.
    for text in texts:
        for rest in re.findall(re.escape(plan.run_dir) + r"/([^\s'\"]*)", text):
            assert rest == "attempts/2" or rest.startswith("attempts/2/") or rest in SHARED, (rest, text[:200])
    wrapper = run_files.render_rank_wrapper(plan)
    assert 'mkdir -p attempts/2/started && echo "$(hostname -s) $$" > attempts/2/started/"rank-$RANK"' in wrapper
    assert not run_files.clashes_with_run_dir("train.py") and run_files.clashes_with_run_dir("attempts")


def _launcher_does(monkeypatch, programs: dict[int, str]) -> None:
    """torchrun replaced by a shell line per attempt (its restart number), in distrun's own launch script."""
    monkeypatch.setattr(Torchrun, "command", lambda self, plan, host: ["bash", "-c", programs[plan.attempt.restart]])


def _stage(plan) -> None:
    for path, text in run_files.launch_files(plan, run_files.launch_scripts(plan)).items():
        target = Path(plan.run_dir) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_a_failed_attempts_launcher_ending_late_writes_only_into_its_own_folder(tmp_path, monkeypatch):
    """The restart begins while the failed attempt's launcher still shuts its workers down: its
    exit code (1) comes after the next attempt started, which still reports its own (0)."""
    cluster_, first = plan_in(tmp_path)
    second = dataclasses.replace(first, attempt=dataclasses.replace(first.attempt, restart=1))
    _launcher_does(monkeypatch, {0: "trap '' TERM; sleep 1.5; exit 1", 1: "sleep 3; exit 0"})
    _stage(first)
    assert starter.launch(cluster_, first, ["n2"]) == {}
    old = Path(rundir.attempt_path(first))
    for _ in range(100):
        if (old / "launcher-n2.pid").is_file():
            break
        time.sleep(0.05)
    _stage(second)
    assert starter.launch(cluster_, second, ["n2"]) == {}
    out = sh(attempt_shell.wait_command(second, "n2"))
    assert out.returncode == 0 and nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "exit": 0}, out.stdout
    assert (old / "exitcode-n2").read_text().strip() == "1"  # it did end late, into its own folder
    assert (Path(rundir.attempt_path(second)) / "exitcode-n2").read_text().strip() == "0"
    assert not list(Path(first.run_dir).glob("exitcode-*")) and not list(Path(first.run_dir).glob("launcher-*"))


def _rank_log(path: Path, rank: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DISTRUN_RANK rank={rank} local_rank=0 world_size=2 host=n1 machine=n1 pid=1\n")


def test_the_collected_rank_logs_are_the_last_attempts(tmp_path):
    nodes = tmp_path / "nodes"
    _rank_log(nodes / "n1/attempts/0/ranks/1/rank.0/stdout", 0)
    _rank_log(nodes / "n1/attempts/0/ranks/1/rank.1/stdout", 1)
    (nodes / "n1/attempts/1").mkdir(parents=True)
    (nodes / "n1/attempts/1/launcher-n1.log").write_text("killed before any rank started\n")
    assert rundir.collected_attempt(nodes) == "attempts/1"
    assert rank_logs(nodes) == {}  # the last attempt started no rank: not the earlier attempt's logs
    _rank_log(nodes / "n1/attempts/1/ranks/1/rank.0/stdout", 0)
    assert rank_logs(nodes) == {0: nodes / "n1/attempts/1/ranks/1/rank.0/stdout"}


def test_the_collected_rank_logs_of_a_run_from_before_attempt_folders_are_at_the_top(tmp_path):
    nodes = tmp_path / "nodes"
    (nodes / "n1").mkdir(parents=True)
    (nodes / "n1/launcher-n1.log").write_text("the last attempt\n")
    _rank_log(nodes / "n1/ranks/1/rank.0/stdout", 0)
    _rank_log(nodes / "n1/attempts/0/ranks/1/rank.0/stdout", 0)  # put aside by a restart of that layout
    assert rundir.collected_attempt(nodes) == ""
    assert rank_logs(nodes) == {0: nodes / "n1/ranks/1/rank.0/stdout"}


def test_a_run_recorded_before_attempt_folders_is_read_at_the_top_of_its_run_dir(tmp_path):
    _, plan = plan_in(tmp_path)
    record = tmp_path / "record"
    record.mkdir()
    data = to_json(plan)
    del data["attempt_dirs"]
    (record / "plan.json").write_text(json.dumps(data, default=str))
    old = liveness.recorded_plan(Run(record, RunMeta("R1", "train", "inv", 0.0)))
    assert not old.attempt.attempt_dirs and rundir.attempt_path(old) == old.run_dir
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "exitcode-n1").write_text("5\n")
    state = liveness.parse_probe("n1", sh(liveness.probe_command(old, "n1")).stdout)
    assert (state.launcher, state.rc) == ("exited", 5)
    # The same folder read with attempt folders: this attempt's launcher has not started.
    state = liveness.parse_probe("n1", sh(liveness.probe_command(plan, "n1")).stdout)
    assert (state.run_dir, state.launcher, state.rc) == (True, "none", None)
    out = sh(attempt_shell.wait_command(old, "n1"))
    assert nodeprog.answer(out.stdout, "follow") == {"verb": "follow", "exit": 5}
