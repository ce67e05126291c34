"""A run's control plane out of its job's reach, on the 3-node cluster through the real CLI: each
attempt's launcher runs in a systemd unit of its own on every node (torchrun: every node
launches), so a job can neither forge how its run ended nor leave the run. Each attack is
tallied in tests/cluster/hostile.py.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap
import time

import pytest

from .conftest import distrun, run_processes
from .hostile import TALLY

RUNS = "/srv/distrun/runs"

# Local rank 0 of every node: a process that leaves the run every way a process can (a double
# fork to init, a session of its own, no tag in its environment, its name changed) and keeps
# the rank's stdout open; forged ends in the launcher's log and in every exit code file of its
# attempt; then the job fails (rank 0), later than the forgeries.
FORGER = textwrap.dedent("""
    import os, subprocess, sys, time
    token = os.environ["TOKEN"]
    if os.environ["LOCAL_RANK"] == "0":
        subprocess.Popen(["bash", "-c", f"(setsid env -i bash -c 'exec -a escapee-{token} sleep 900' &)"],
                         stdin=subprocess.DEVNULL, stdout=sys.stdout, stderr=sys.stderr, close_fds=False)
        attempt = os.path.join(os.environ["DISTRUN_RUN_DIR"], "attempts", "0")
        for k in (1, 2, 3):
            with open(os.path.join(attempt, f"exitcode-node{k}"), "w") as f:
                f.write("0\\n")
        # Straight into the launcher's log too (torchrun prefixes what a rank prints): raw lines.
        with open(os.path.join(attempt, f"launcher-{os.uname().nodename}.log"), "a") as f:
            f.write('\\nDISTRUN_EXIT 0\\n{"verb": "follow", "exit": 0}\\n')
    print("DISTRUN_EXIT 0", flush=True)
    print('{"verb": "follow", "exit": 0}', flush=True)
    time.sleep(float(os.environ.get("SLEEP", "6")))
    sys.exit(5 if os.environ["RANK"] == "0" else 0)
""")


def escapees(cluster, token: str) -> dict[int, int]:
    """node -> how many processes named escapee-<token> live there."""
    found = {}
    for k in (1, 2, 3):
        out = cluster.exec(k, f"pgrep -c -f '^escapee-{token}'", check=False).stdout.strip()
        found[k] = int(out) if out.isdigit() else 0
    return found


# torchrun: a launcher on every node; mpirun: one on the head, whose daemons on the other nodes
# it starts over ssh (each inside its node's unit of the run).
LAUNCHERS = pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])


@LAUNCHERS
def test_a_job_cannot_forge_its_end_or_keep_train_waiting(provisioned, distrun_home, tmp_path, launcher):
    token = secrets.token_hex(6)
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    started = time.monotonic()
    result = distrun("train", "--inventory", "test", "--launcher", launcher, "--script", str(script),
                     "--env", f"TOKEN={token}", timeout=600)
    took = time.monotonic() - started
    try:
        out = result.stdout + result.stderr
        TALLY.record("a forged exit marker or exit code file makes a failing run succeed", result.rc == 0)
        assert result.rc != 0, out[-3000:]
        # The forgeries are the job's output, shown as such; the run ends when rank 0 fails.
        assert "DISTRUN_EXIT 0" in result.stdout, out[-3000:]
        run = sorted((distrun_home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)[-1]
        meta = json.loads((run / "meta.json").read_text())
        assert meta["status"] == "failed", meta
        TALLY.record("a process that keeps a rank's output open keeps train waiting after the ranks end", took > 300)
        assert took < 300, f"train took {took:.0f} s"
        left = escapees(provisioned, token)
        TALLY.record("a process that left its run (double fork, setsid, env -i) outlives the run", any(left.values()))
        assert not any(left.values()), left
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"pkill -9 -f '^escapee-{token}'", check=False)


@LAUNCHERS
def test_stop_ends_every_process_that_left_its_run_and_the_nodes_keep_the_true_state(provisioned, distrun_home,
                                                                                     tmp_path, launcher):
    token = secrets.token_hex(6)
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    detach = distrun("train", "--inventory", "test", "--launcher", launcher, "--script", str(script),
                     "--env", f"TOKEN={token}", "--env", "SLEEP=600", "--detach", timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    run_id = detach.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d{8}-\d{6}-train-[0-9a-f]{4}", run_id), detach.stdout[-2000:]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(escapees(provisioned, token).values()):
            time.sleep(1)
        assert all(escapees(provisioned, token).values()), escapees(provisioned, token)
        for k in (1, 2, 3):  # the job's forged exit codes are there
            assert provisioned.exec(k, f"cat {RUNS}/{run_id}/attempts/0/exitcode-node{k}").stdout.strip() == "0"

        # The nodes are asked (no controller follows a detached run): the forged files change nothing.
        status = distrun("status", run_id, "--json", timeout=120)
        assert status.rc == 0, status.stderr
        state = json.loads(status.stdout)
        TALLY.record("exit code files the job wrote make its running run 'succeeded'", state["state"] != "running")
        assert state["state"] == "running", state

        stop = distrun("stop", run_id, timeout=300)
        assert stop.rc == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
        left = escapees(provisioned, token)
        TALLY.record("a process that left its run (double fork, setsid, env -i) outlives 'distrun stop'",
                     any(left.values()))
        assert not any(left.values()), left
        assert not run_processes(provisioned, run_id)
        # A stopped run is not recorded as succeeded, whatever its files say.
        status = distrun("status", run_id, "--json", timeout=120)
        assert json.loads(status.stdout)["state"] != "succeeded", status.stdout
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"pkill -9 -f '^escapee-{token}'", check=False)
        distrun("stop", run_id, timeout=300)
