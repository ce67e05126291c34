"""Runs that race, on the 3-node cluster through the real CLI: 'distrun stop' from another shell
while a run starts (planned, probed, launching) or runs, and two 'distrun train' on the same
nodes at once. A stop reaches the run in whatever state it is, the run never launches after it,
and its record says stopped; of two runs started together one runs and the other is refused as
busy, naming the run that holds the hosts, with an exit code of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from .conftest import distrun, run_processes, start_distrun

# Every rank says it started (a marker line), then sleeps as long as SLEEP says.
SLEEPER = textwrap.dedent("""
    import os, time
    print(f"SLEEPER rank={os.environ['RANK']} started", flush=True)
    time.sleep(float(os.environ.get("SLEEP", "0")))
""")
RUN_ID = re.compile(r"run (\d{8}-\d{6}-train-[0-9a-f]{4}): record in")
BUSY = 8  # errors.ExitCode.BUSY


def _wait_for(log: Path, proc: subprocess.Popen, pattern: re.Pattern[str] | str, within_s: float,
              poll_s: float = 0.02) -> re.Match[str]:
    deadline = time.monotonic() + within_s
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    while time.monotonic() < deadline:
        m = rx.search(log.read_text())
        if m:
            return m
        assert proc.poll() is None, f"train ended (exit {proc.returncode}) before {rx.pattern!r}:\n{log.read_text()[-3000:]}"
        time.sleep(poll_s)
    raise AssertionError(f"no {rx.pattern!r} within {within_s}s:\n{log.read_text()[-3000:]}")


# Where the run is when the stop comes: the line of train's output that says so.
STATES = {
    "planned": None,  # the record exists (its first line): the claim and run.yml have just begun
    "probed": re.escape("Probe env"),  # run.yml's probes run on every node
    "launching": re.escape("Judge the probes"),  # judged: staging and the launchers' start follow at once
    "running": r"SLEEPER rank=\d started",  # followed: the ranks run
}


@pytest.mark.parametrize("state", list(STATES))
def test_a_stop_from_another_shell_reaches_a_run_in_every_state_and_it_never_launches(provisioned, distrun_home,
                                                                                     tmp_path, state):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = start_distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=600", log=out)
        try:
            run_id = _wait_for(log, proc, RUN_ID, 120)[1]
            if STATES[state]:
                _wait_for(log, proc, STATES[state], 120)
            stop = distrun("stop", run_id, timeout=300)
            rc = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert stop.rc == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    assert rc == 130, f"train exited {rc} after 'distrun stop' while {state}:\n{text[-3000:]}"
    meta = json.loads((distrun_home / "runs" / run_id / "meta.json").read_text())
    assert (meta["status"], meta["rc"]) == ("stopped", 130), meta
    assert "stopped by 'distrun stop'" in meta["summary"], meta
    assert "Traceback" not in text + stop.stderr
    # Nothing of the run runs anywhere once the stop returned, and nothing starts later.
    assert not run_processes(provisioned, run_id)
    time.sleep(3)
    assert not run_processes(provisioned, run_id)
    if state != "running":
        assert "SLEEPER" not in text, f"the run launched after 'distrun stop' while {state}:\n{text[-3000:]}"


@pytest.mark.parametrize("gap_s", [0.0, 0.3, 1.0])
def test_two_trains_on_the_same_nodes_at_once_one_runs_and_the_other_is_refused_as_busy_naming_it(
        provisioned, distrun_home, tmp_path, gap_s):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    results: dict[int, object] = {}

    def train(k: int) -> None:
        results[k] = distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=4", timeout=300)

    threads = [threading.Thread(target=train, args=(k,)) for k in (0, 1)]
    threads[0].start()
    time.sleep(gap_s)
    threads[1].start()
    for t in threads:
        t.join(timeout=400)
    codes = sorted(r.rc for r in results.values())  # type: ignore[attr-defined]
    shown = "\n----\n".join(r.stdout[-2000:] + r.stderr[-2000:] for r in results.values())  # type: ignore[attr-defined]
    assert codes == [0, BUSY], f"exit codes {codes}:\n{shown}"
    ran = next(r for r in results.values() if r.rc == 0)  # type: ignore[attr-defined]
    refused = next(r for r in results.values() if r.rc == BUSY)  # type: ignore[attr-defined]
    winner = RUN_ID.search(ran.stdout)[1]
    said = " ".join(refused.stderr.split())
    assert f"busy with run {winner} " in said, said
    assert "leftover" not in shown and "in use" not in shown and "preflight failed" not in shown, shown
    assert not run_processes(provisioned, winner)
