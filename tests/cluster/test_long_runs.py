"""Runs that outlive the terminal, on the 3-node cluster through the real CLI: a detached run,
its follower killed with SIGKILL, the run read live from the nodes, followed again to its end;
a second run on the busy hosts refused meanwhile. It kills a follower and keeps the hosts busy
for a while, so it runs after the tests that need idle hosts (phase 1).

Bounds on time only catch a hang; the latencies themselves are measured by bench/cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO, distrun, run_processes
from .test_train import _rank_lines

pytestmark = pytest.mark.phase(1)

# Every rank says where it runs, sleeps, meets the others; then rank 1 fails with exit code 3.
SCRIPT = textwrap.dedent("""
    import os, socket, sys, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    print(f"SCRIPT rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} mpi_rank={comm.Get_rank()} "
          f"host={socket.gethostname()} sum={comm.allreduce(comm.Get_rank() + 1)}", flush=True)
    time.sleep(float(os.environ["SLEEP"]))
    comm.Barrier()
    print(f"SCRIPT rank={comm.Get_rank()} done", flush=True)
    sys.exit(3 if comm.Get_rank() == 1 else 0)
""")


def _popen(*args: str, env: dict) -> subprocess.Popen[str]:
    return subprocess.Popen([str(Path(sys.executable).parent / "distrun"), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_detached_run_outlives_its_follower_and_is_followed_again_to_its_end(provisioned, distrun_home, tmp_path, capsys):
    script = tmp_path / "sleeper.py"
    script.write_text(SCRIPT)
    detach = distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=40", "--detach", timeout=600)
    assert detach.rc == 0, detach.stdout[-3000:] + detach.stderr[-2000:]
    run_id = detach.stdout.strip().splitlines()[-1]  # the last line is the run id alone
    assert re.fullmatch(r"\d{8}-\d{6}-train-[0-9a-f]{4}", run_id), detach.stdout[-2000:]
    assert "3 of 3 rank(s) started" in detach.stdout
    run = distrun_home / "runs" / run_id
    assert json.loads((run / "meta.json").read_text())["controller"] is None

    try:
        # Follow it, then kill the follower as a laptop's terminal dies: SIGKILL, nothing cleaned up.
        env = {**os.environ, "COLUMNS": "200"}
        follower = _popen("attach", run_id, env=env)
        assert follower.stdout is not None
        assert "attached to run" in follower.stdout.readline()
        time.sleep(2)
        follower.send_signal(signal.SIGKILL)
        follower.wait()

        # The record still says running, its controller is dead: the nodes are asked.
        listed = distrun("runs", timeout=120)
        row = next(line for line in listed.stdout.splitlines() if run_id in line)
        assert "running (live)" in row, listed.stdout
        status = distrun("status", run_id, "--json", timeout=120)
        assert status.rc == 0, status.stderr
        state = json.loads(status.stdout)
        assert state["state"] == "running" and state["controller"]["alive"] is False, state
        assert state["hosts"]["node1"]["launcher"] == "running" and state["started_ranks"] == [0, 1, 2], state
        assert all(h["processes"] > 0 for h in state["hosts"].values()), state

        # One run at a time: a second train on the same hosts is refused, naming the running one.
        started = time.monotonic()
        second = distrun("train", "--inventory", "test", "--script", str(script), "--env", "SLEEP=0", timeout=120)
        refused_after = time.monotonic() - started
        with capsys.disabled():
            print(f"\na second train on busy hosts was refused after {refused_after:.1f}s "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        assert second.rc == 8, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"busy with run {run_id} (running there now)" in second.stderr.replace("\n", " ")
        assert refused_after < 60, "refusing a run on busy hosts hangs"

        # 'logs -f' with no follower reads the head live and ends when the run ends; 'attach'
        # follows it to the end, collects every rank's log and records the exit code.
        logs_box: dict = {}
        logs = threading.Thread(target=lambda: logs_box.setdefault("r", distrun("logs", run_id, "-f", timeout=300)))
        logs.start()
        attach = distrun("attach", run_id, timeout=300)
        logs.join(timeout=120)
        assert not logs.is_alive(), "'distrun logs -f' did not end with the run"
        assert logs_box["r"].rc == 0, logs_box["r"].stderr
        assert len(re.findall(r"SCRIPT rank=\d world=3", logs_box["r"].stdout)) == 3, logs_box["r"].stdout[-2000:]

        assert attach.rc == 1, attach.stdout[-3000:] + attach.stderr[-2000:]  # as 'distrun train' exits for a failed rank
        assert "first failing rank 1 on node2" in attach.stdout.replace("\n", " "), attach.stdout[-2000:]
        meta = json.loads((run / "meta.json").read_text())
        assert (meta["status"], meta["rc"], meta["collected"], meta["controller"]) == ("failed", 1, True, None), meta
        on_node = provisioned.exec(1, f"cat /srv/distrun/runs/{run_id}/attempts/0/exitcode-node1").stdout.strip()
        assert f"failed rc={on_node}" in meta["summary"], (on_node, meta)  # the launcher's own exit code, kept
        assert sorted(_rank_lines(run)) == [0, 1, 2]
        assert not run_processes(provisioned, run_id)
    finally:
        # Whatever failed above, the hosts are left idle for the tests after this one.
        if run_processes(provisioned, run_id):
            distrun("stop", run_id, timeout=300)
