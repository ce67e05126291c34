"""A detached mpirun run's supervisor on the head (role job's files/supervise.py), as the controller
reads it when it comes back: every try, how each ended, the hosts the next one left out and why.

The record lies in the attempt's folder (launchers/mpirun.py SUPERVISOR_RECORD) and is written by
the supervisor, a process of the training user's, as the job's ranks are: a job can rewrite it.
It is read bounded and strictly (what does not fit the form is left out), shown labelled as the
supervisor's report, and never used for a decision; the run's state and exit code are root's
record of the head's unit (run/liveness.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from distrun.transport import rundir

REPORTED_BY = ("the supervisor on the head (a process of the training user's, as the job is: "
               "a job can rewrite this record; the run's end is root's record of the head's unit)")
MAX_BYTES = 64 << 10
MAX_TRIES = 101  # --max-restarts is at most 100
_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
_SIGNAL = re.compile(r"[A-Z0-9+]{1,12}")
_STATES = ("running", "succeeded", "failed", "stopped")


def _names(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str) and _NAME.fullmatch(v)][:1024] if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -10**6 < value < 10**12 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 10**11 else None


def _text(value: Any) -> str:
    return "".join(c if c.isprintable() else "?" for c in value)[:500] if isinstance(value, str) else ""


def parse(raw: Any) -> dict[str, Any] | None:
    """The record's form (supervise.py's Supervisor.record), or None when it is not one."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tries"), list):
        return None
    tries: list[dict[str, Any]] = []
    for t in raw["tries"][:MAX_TRIES]:
        if not isinstance(t, dict):
            continue
        signal = t.get("signal")
        tries.append({"try": _int(t.get("try")), "restart": _int(t.get("restart")), "hosts": _names(t.get("hosts")),
                      "started": _number(t.get("started")), "ended": _number(t.get("ended")), "rc": _int(t.get("rc")),
                      "signal": signal if isinstance(signal, str) and _SIGNAL.fullmatch(signal) else None,
                      "lost": _names(t.get("lost")), "excluded": _names(t.get("excluded")),
                      "decision": _text(t.get("decision"))})
    state = raw.get("state")
    return {"reported_by": REPORTED_BY, "state": state if state in _STATES else "unknown", "reason": _text(raw.get("reason")),
            "tries": tries, "excluded": sorted({h for t in tries for h in _names(t["excluded"])})}


def now_text(record: dict[str, Any] | None, max_restarts: int) -> str:
    """Where a running supervised run is, for status's detail: "" before its first restart."""
    if not record or len(record["tries"]) < 2:
        return ""
    last = record["tries"][-1]
    out = f"the supervisor's try {last['try']} (restart {last['try']} of {max_restarts}) runs on {', '.join(last['hosts'])}"
    if record["excluded"]:
        out += f"; left out: {', '.join(record['excluded'])}"
    return out + " (as the supervisor reported it)"


def read(path: Path) -> dict[str, Any] | None:
    """A record in a file (a collected copy), bounded; None where there is none or it is not one."""
    data = rundir.read_job_file(path, MAX_BYTES)
    if data is None:
        return None
    try:
        return parse(json.loads(data))
    except ValueError:
        return None


def collected(nodes: Path, name: str) -> dict[str, Any] | None:
    """The supervisor's record in a collected copy of the run (``nodes/<host>/<last attempt>/name``:
    the head's; on a shared folder every node's copy holds the same file)."""
    if not nodes.is_dir():
        return None
    rel = rundir.collected_attempt(nodes)
    for path in sorted(nodes.glob(f"*/{rel + '/' if rel else ''}{name}"))[:64]:
        record = read(path)
        if record is not None:
            return record
    return None
