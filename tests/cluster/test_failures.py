"""Failure handling on the 3-node cluster: a stopped node, a node lost mid-run.

These tests assert what happens (the node is named, the run ends, nothing is left running), with
bounds far above the measured latencies so that a loaded 2-core machine does not fail them: they
catch a hang, not a slow second. The latencies themselves are measured by bench/cluster.py
(section "failures"), next to the machine's load.

They stop and kill nodes, so they run after every test that needs all nodes up
(``phase(1)``, see tests/conftest.py); each test still brings its node back.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from .conftest import bring_back, distrun, run_processes
from .test_train import _latest_run

pytestmark = pytest.mark.phase(1)

LONG_SCRIPT = """
import os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"SCRIPT rank={os.environ['RANK']} host={socket.gethostname()}", flush=True)
for _ in range(600):
    comm.Barrier()
    time.sleep(1)
"""


def _restore(cluster, k: int) -> None:
    cluster.start_node(k)  # waits for its sshd


def test_check_names_a_stopped_node_and_train_refuses_to_start(provisioned, distrun_home, tmp_path):
    provisioned.stop_node(2)
    try:
        started = time.monotonic()
        check = distrun("check", "--inventory", "test", "--json", timeout=120)
        elapsed = time.monotonic() - started
        assert check.rc != 0
        report = json.loads(check.stdout)
        assert report["hosts"]["node2"]["state"] in ("unreachable", "not reached"), report
        assert report["hosts"]["node1"]["state"] == "ok"
        print(f"distrun check named the stopped node2 after {elapsed:.1f}s", flush=True)
        assert elapsed < 120, f"distrun check took {elapsed:.1f}s to notice a stopped node: it hangs"

        script = tmp_path / "noop.py"
        script.write_text("print('should not run')\n")
        train = distrun("train", "--inventory", "test", "--script", str(script), timeout=120)
        assert train.rc == 3
        assert "preflight failed on node2" in train.stderr.replace("\n", " ")
        assert "nothing was started" in train.stderr.replace("\n", " ")
    finally:
        _restore(provisioned, 2)


def test_losing_a_node_mid_run_stops_everything(provisioned, distrun_home, tmp_path):
    script = tmp_path / "long.py"
    script.write_text(LONG_SCRIPT)
    box: dict = {}

    def run() -> None:
        box["result"] = distrun("train", "--inventory", "test", "--script", str(script), timeout=600)
        box["ended"] = time.monotonic()

    before = set((distrun_home / "runs").glob("*-train-*"))  # earlier tests' runs printed the same lines
    worker = threading.Thread(target=run)
    worker.start()
    try:
        # Wait until every rank of this run is running, then pull the plug on node3.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = sorted(set((distrun_home / "runs").glob("*-train-*")) - before, key=lambda p: p.stat().st_mtime)
            log = runs[-1] / "launcher.log" if runs else None
            if log and log.is_file() and "SCRIPT rank=2" in log.read_text(errors="replace"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the job never started on every rank")
        killed = time.monotonic()
        provisioned.kill_node(3)
        worker.join(timeout=120)
        assert not worker.is_alive(), "distrun did not return after a node was lost"
        result = box["result"]
        assert result.rc != 0
        print(f"distrun ended the run {box['ended'] - killed:.1f}s after node3 was killed", flush=True)
        assert box["ended"] - killed < 120, f"distrun took {box['ended'] - killed:.1f}s to end the run: it hangs"
        assert "node3" in result.stdout
        assert "lost contact with node3" in result.stdout + result.stderr, result.stdout[-3000:]
        run = _latest_run(distrun_home)
        assert not run_processes(provisioned, run.name, (1, 2))
        # The run drained node3 (its follower's ssh failed, or its stop could not reach it), and says so.
        drained = json.loads(distrun("show", run.name, "--json", timeout=120).stdout)["drained"]
        assert list(drained) == ["node3"] and drained["node3"].startswith("lost"), drained
        assert "drained: node3 is drained since" in result.stdout + result.stderr, result.stderr[-3000:]
    finally:
        worker.join(timeout=300)
        bring_back(provisioned, 3)
