"""A node lost mid-run with --max-restarts 1 --exclude-failed: the run restarts on the two nodes
left, resumes from its last checkpoint, and ends exactly where a run resumed from the same
checkpoint ends (exactness, not timing). It kills a node, so it runs after the tests that need
every node (phase 1) and brings the node back.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from .conftest import distrun, run_processes

pytestmark = pytest.mark.phase(1)

# The reference DDP workload on a small synthetic graph under torchrun. An epoch takes tens of
# ms; paced to 0.3 s, the run goes on for 7.5 s after its first checkpoint, time enough to see it
# and stop a node on a loaded machine (podman commands wait on each other's locks while
# molecule's containers run). Pacing changes no result: the uninterrupted reference run is not paced.
EPOCHS = 30
TRAIN = ["--inventory", "test", "--launcher", "torchrun", "--workload", "ddp", "--epochs", str(EPOCHS)]
WORKLOAD = ["--syn-nodes", "1000", "--syn-edges", "8000", "--checkpoint-every", "5"]
PACED = ["--min-epoch-seconds", "0.3"]
RESUMED = re.compile(r"resumed from epoch (\d+) \(checkpoint (\S+)\)")


def test_a_lost_node_restarts_the_run_without_it_and_it_resumes_exactly(provisioned, distrun_home):
    before = set((distrun_home / "runs").glob("*-train-*"))
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", distrun(
        "train", *TRAIN, "--max-restarts", "1", "--exclude-failed", "--", *WORKLOAD, *PACED, timeout=1200)))
    worker.start()
    try:
        started = time.monotonic()
        deadline = started + 600
        run = None
        while time.monotonic() < deadline and worker.is_alive():
            new = sorted(set((distrun_home / "runs").glob("*-train-*")) - before)
            if new:
                run = new[-1]
                # Over ssh, not podman exec: podman's lock may be held by another test's containers.
                ls = provisioned.ssh(1, f"ls /srv/distrun/checkpoints/{run.name} 2>/dev/null; true").stdout
                if "epoch-" in ls:
                    break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no checkpoint was written: {box.get('r')}")
        assert run is not None
        print(f"node3 stopped {time.monotonic() - started:.1f} s into the run", flush=True)
        provisioned.kill_node(3)
        worker.join(timeout=900)
        assert not worker.is_alive(), "the restarted run did not end"
        result = box["r"]
        assert result.rc == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert "restart 1 of 1 on node1, node2" in result.stderr.replace("\n", " "), result.stderr[-2000:]

        meta = json.loads((run / "meta.json").read_text())
        assert meta["status"] == "succeeded" and meta["restarts"] == 1, meta
        plan = json.loads((run / "plan.json").read_text())  # the last attempt's
        assert [h["name"] for h in plan["hosts"]] == ["node1", "node2"] and plan["world_size"] == 2
        assert ["DISTRUN_RESTART", "1"] in plan["env"]
        log = (run / "launcher.log").read_text(errors="replace")
        after_restart = log.split("DISTRUN_RESTART 1", 1)[1]
        found = RESUMED.search(after_restart)
        assert found, after_restart[-3000:]
        epoch, checkpoint = int(found[1]), found[2]
        print(f"the restarted run resumed from epoch {epoch} ({checkpoint})", flush=True)
        assert epoch >= 5 and checkpoint == f"/srv/distrun/checkpoints/{run.name}/epoch-{epoch:06d}.ckpt"
        restarted = json.loads((run / "result.json").read_text())
        assert restarted["ranks"] == 2 and restarted["epochs"] == EPOCHS
        assert not run_processes(provisioned, run.name, (1, 2))
    finally:
        worker.join(timeout=900)
        provisioned.start_node(3)

    # The same two nodes, uninterrupted, from the same checkpoint: the same final loss, exactly.
    reference = distrun("train", *TRAIN, "--np", "2", "--", *WORKLOAD, "--resume-from", checkpoint, timeout=900)
    assert reference.rc == 0, reference.stdout[-4000:] + reference.stderr[-2000:]
    assert f"resumed from epoch {epoch}" in reference.stdout
    ref_run = sorted((distrun_home / "runs").glob("*-train-*"), key=lambda p: p.stat().st_mtime)[-1]
    uninterrupted = json.loads((ref_run / "result.json").read_text())
    assert uninterrupted["ranks"] == 2
    assert restarted["loss"] == uninterrupted["loss"], (restarted, uninterrupted)
    assert restarted["test_acc"] == uninterrupted["test_acc"]
