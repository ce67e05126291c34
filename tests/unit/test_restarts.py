"""A failed attempt's files are its own: its launchers have ended before a restart puts its
files aside, and a launch script that ends late writes nothing among the next attempt's files.
Run for real in a local shell, with the launch script distrun renders."""

from __future__ import annotations

import re
import time
from pathlib import Path

from distrun import follow, restarts
from distrun.bundle import launch_scripts

from .test_follow import plan_in, sh

LAUNCHER_LINE = re.compile(r"^.*(> launcher-n1\.log 2>&1 < /dev/null)$", re.M)


def _staged(tmp_path: Path, launcher_command: str):
    """The run dir with n1's rendered launch script, its launcher replaced by launcher_command."""
    cluster, plan = plan_in(tmp_path)
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    script, n = LAUNCHER_LINE.subn(lambda m: f"{launcher_command} {m[1]}", launch_scripts(plan)["n1"])
    assert n == 1
    (run_dir / "launch-n1.sh").write_text(script)
    return cluster, plan, run_dir


def _wait_for(path: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), path


def _alive(pid: int) -> bool:
    """Whether pid still runs n1's launch script (not a zombie, not another program)."""
    try:
        return "launch-n1.sh" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def test_a_launch_script_writes_its_exit_code_when_its_launcher_ends(tmp_path):
    cluster, plan, run_dir = _staged(tmp_path, "sh -c 'exit 3'")
    assert follow.launch(cluster, plan, ["n1"]) == {}
    _wait_for(run_dir / "exitcode-n1")
    assert (run_dir / "exitcode-n1").read_text().strip() == "3"


def test_a_launch_script_ending_after_its_attempt_was_put_aside_writes_no_exit_code(tmp_path):
    cluster, plan, run_dir = _staged(tmp_path, "sleep 1.5")
    assert follow.launch(cluster, plan, ["n1"]) == {}
    _wait_for(run_dir / "launcher-n1.pid")
    assert sh(restarts.archive_command(plan, 0)).returncode == 0
    assert (run_dir / "attempts/0/launcher-n1.pid").exists()
    time.sleep(2.5)  # the launcher has ended by now
    assert not list(run_dir.glob("exitcode-n1*")), sorted(p.name for p in run_dir.iterdir())
    assert not list((run_dir / "attempts/0").glob("exitcode-n1*"))


def test_settle_waits_for_a_launcher_that_ends_on_its_own(tmp_path):
    cluster, plan, run_dir = _staged(tmp_path, "sleep 1")
    assert follow.launch(cluster, plan, ["n1"]) == {}
    _wait_for(run_dir / "launcher-n1.pid")
    assert restarts.settle(cluster, plan, lost={"n2", "n3"}) == {}
    assert (run_dir / "exitcode-n1").read_text().strip() == "0"


def test_settle_kills_a_launch_script_that_outlasts_its_time_and_no_exit_code_comes_later(tmp_path):
    # A launcher that ignores TERM and takes its time, as torchrun's agent shutting its workers down.
    cluster, plan, run_dir = _staged(tmp_path, "sh -c 'trap \"\" TERM; sleep 30'")
    assert follow.launch(cluster, plan, ["n1"]) == {}
    _wait_for(run_dir / "launcher-n1.pid")
    pid = int((run_dir / "launcher-n1.pid").read_text())
    started = time.monotonic()
    assert restarts.settle(cluster, plan, lost={"n2", "n3"}, wait_s=0.5) == {}
    assert time.monotonic() - started < 10
    assert not _alive(pid)
    time.sleep(0.5)
    assert not (run_dir / "exitcode-n1").exists()


def test_settle_passes_a_host_whose_launcher_never_started_and_names_an_unreadable_run_dir(tmp_path):
    cluster, plan = plan_in(tmp_path)
    Path(plan.run_dir).mkdir(parents=True)
    assert restarts.settle(cluster, plan, lost={"n3"}) == {}
    Path(plan.run_dir).rmdir()
    failed = restarts.settle(cluster, plan, lost={"n3"})
    assert set(failed) == {"n1", "n2"} and f"cannot enter the run directory {plan.run_dir}" in failed["n1"]
