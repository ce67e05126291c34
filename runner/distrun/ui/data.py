"""What a run record says, as data: the objects behind ``runs --json``, ``show --json`` and
``train --json`` (docs/guide/cli.md documents them; tests/unit/test_cli_json.py checks them).

A key, once published, keeps its name and meaning; new keys may appear (``schema`` counts
changes that are not additions).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from distrun.launchers.mpirun import SUPERVISOR_RECORD
from distrun.planning import containers
from distrun.run import supervision
from distrun.run.collect_rules import LEFT_FILE
from distrun.run.diagnosis import rank_logs
from distrun.run.starts import collected
from distrun.store.runs import Run
from distrun.transport import rundir

SCHEMA = 1


def status_of(run: Run) -> str:
    """The run's status as the read commands show it: ``running``, ``succeeded``, ``failed`` or
    ``stopped``, as the record says. Where the record and the cluster disagree (a controller that
    died), the reconciled word belongs here, so every read command agrees."""
    return run.meta.status


def when(timestamp: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in local time with its offset."""
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _json_file(path: Path) -> Any:
    """A JSON file of the record, or None when it is missing, unreadable or not JSON."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary(run: Run) -> dict[str, Any]:
    """One run, as ``distrun runs --json`` lists it."""
    m = run.meta
    return {
        "run_id": m.run_id,
        "verb": m.verb,
        "status": status_of(run),
        "rc": m.rc,
        "inventory": m.inventory,
        "started": when(m.started),
        "finished": when(m.finished),
        "duration_s": None if m.duration is None else round(m.duration, 3),
        "summary": m.summary,
        "dir": str(run.dir),
        "drained": {str(node): str(why) for node, why in sorted(m.drained.items())},  # the nodes it lost, drained
    }


def detail(run: Run) -> dict[str, Any]:
    """One run with what its record holds, as ``distrun show RUN --json`` prints it."""
    out: dict[str, Any] = {"schema": SCHEMA, **summary(run)}
    result = _json_file(run.dir / "result.json")
    out["result"] = result if isinstance(result, dict) else None
    timings = _json_file(run.dir / "timings.json")
    out["timings"] = timings if isinstance(timings, dict) else None
    plan = _json_file(run.dir / "plan.json")
    out["plan"] = _plan(plan) if isinstance(plan, dict) else None
    commands = _json_file(run.dir / "commands.json")
    commands = commands if isinstance(commands, dict) else {}
    text = run.dir / "commands.txt"
    out["commands"] = {
        "file": str(text) if text.is_file() else None,
        "partition": commands.get("partition"),
        "launch": commands.get("launch") or {},
    }
    image = _json_file(run.dir / containers.RECORD)
    out["image"] = image if isinstance(image, dict) else None  # a run with --image: the id each node had
    launcher_log = run.dir / "launcher.log"
    nodes = run.dir / "nodes"
    # A launcher that restarts in place: each node's starts, as the job's wrappers counted them.
    starts = collected(nodes)
    out["starts"] = starts.as_dict() if starts is not None else None
    # A detached mpirun run's supervisor on the head: its tries, as it reported them.
    out["supervisor"] = supervision.collected(nodes, SUPERVISOR_RECORD)
    ansible = run.dir / "ansible"
    out["logs"] = {
        "launcher": str(launcher_log) if launcher_log.is_file() else None,
        "ranks": {str(rank): str(path) for rank, path in sorted(rank_logs(nodes).items())} if nodes.is_dir() else {},
        "nodes": str(nodes) if nodes.is_dir() else None,
        "ansible": str(ansible) if ansible.is_dir() else None,
        "left_on_nodes": str(left) if (left := run.dir / LEFT_FILE).is_file() else None,
    }
    return out


def _plan(plan: dict[str, Any]) -> dict[str, Any]:
    hosts = [{"name": str(h.get("name")), "ranks": h.get("slots")} for h in plan.get("hosts") or [] if isinstance(h, dict)]
    shared = str(plan.get("shared_dir") or "").rstrip("/")
    return {
        "launcher": plan.get("launcher"),
        "world_size": plan.get("world_size"),
        "hosts": hosts,
        "workload": plan.get("workload"),
        "program": plan.get("program"),
        "run_dir": rundir.run_dir(shared, str(plan.get("run_id"))) if shared else None,
        "container": plan.get("container") if isinstance(plan.get("container"), dict) else None,
    }


def listing(runs: list[Run]) -> dict[str, Any]:
    """``distrun runs --json``: every run record, oldest first."""
    return {"schema": SCHEMA, "runs": [summary(r) for r in runs]}


def train_outcome(run: Run | None, exit_code: int, error: str | None = None) -> dict[str, Any]:
    """``distrun train --json``: the run as ``show --json`` gives it, with distrun's exit code,
    and the one-line error when the run was refused (``run_id`` null: refused before it had a record)."""
    if run is None:
        out: dict[str, Any] = {"schema": SCHEMA, "run_id": None, "status": "refused", "rc": None, "result": None}
    else:
        out = detail(run)
    out["exit_code"] = exit_code
    out["error"] = error
    return out
