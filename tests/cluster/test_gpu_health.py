"""'distrun check' on the CPU test nodes: the GPU health read runs on every node and finds no GPU,
so the report has no 'gpu health' row and drains nothing; a node drained before (as a run that
lost it would) comes back with a check that passes there, and 'check --clear' brings one back.
(No GPU here: the path of a faulty GPU is tests/unit/test_gpuhealth.py's, on sample outputs.)"""

from __future__ import annotations

import json
from pathlib import Path

from distrun.store import drained

from .conftest import REPO, distrun

INVENTORY = REPO / "inventory" / "test"


def readings(run_dir: Path) -> dict[str, dict]:
    """Node -> the GPU health reading its check published (fact preflight_gpu_health), from the
    playbook's events kept in the check's record."""
    found = {}
    for f in run_dir.rglob("job_events/*.json"):
        event = json.loads(f.read_text())
        data = event.get("event_data") or {}
        facts = (data.get("res") or {}).get("ansible_facts") or {}
        if event.get("event") == "runner_on_ok" and "preflight_gpu_health" in facts:
            found[data["host"]] = facts["preflight_gpu_health"]
    return found


def test_cpu_nodes_read_no_gpu_and_a_passing_check_brings_a_drained_node_back(provisioned, distrun_home):
    mark = drained.drain(INVENTORY, "node2", "node2 stopped answering (run 20251103-train-x)", "run 20251103-train-x")
    before = set((distrun_home / "runs").glob("*-check-*"))
    res = distrun("check", "--inventory", "test", "--json", timeout=300)
    report = json.loads(res.stdout)
    assert res.rc == 0, json.dumps(report, indent=1)[-3000:]
    assert "gpu health" not in report["checks"] and report["checks"]["gpus vs slots"]["node1"]["detail"].endswith(
        "no GPU detected")
    run_dir = max(set((distrun_home / "runs").glob("*-check-*")) - before, key=lambda p: p.stat().st_mtime)
    got = readings(run_dir)
    assert sorted(got) == ["node1", "node2", "node3"], got
    assert all(r["devices"] == 0 and r["smi"] == "" and "query" not in r and r["boot"] > 0 for r in got.values()), got
    # node2 passed every check: its mark is gone, in the report and on the controller.
    assert report["drained"] == {} and drained.drained(INVENTORY) == {}, mark

    # --clear NODE: one line, the mark gone.
    drained.drain(INVENTORY, "node3", "Xid 79 on GPU 0000:3a:00 (GPU has fallen off the bus)", drained.SOURCE_GPU_HEALTH)
    res = distrun("check", "--inventory", "test", "--clear", "node3")
    assert res.rc == 0 and res.stdout.startswith("node3 is back: cleared its drain from "), res.stdout + res.stderr
    assert drained.drained(INVENTORY) == {}
