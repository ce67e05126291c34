"""A self-restarting run's starts, as its job reported them: how many times each node's local
ranks were started in the last attempt, and so which restart in place the run ended on.

The rank wrapper appends a line to ``started/starts-<host>-<local rank>`` at each start (its
DISTRUN_RESTART, run_files.py); a launcher that restarts in place (torchrun's agents) leaves
one line per start there. Those files lie in the run directory, which the job can write: what
they say is the job's own claim, read bounded (files, bytes, names) and strictly (a line is a
process id, a name is the wrapper's), shown labelled as such and never used for a decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distrun.transport import rundir

MAX_FILES = 1024  # starts files read per run: one per node's local rank
MAX_BYTES = 64 << 10  # bytes read per file: thousands of starts
_NAME = re.compile(re.escape(rundir.STARTS_PREFIX) + r"([A-Za-z0-9._-]{1,253})-([0-9]{1,5})")
_PID = re.compile(r"[0-9]{1,10}")


@dataclass
class Starts:
    """What the job's wrappers wrote: host -> local rank -> how many times it was started."""

    attempt: int  # the attempt whose folder holds them (distrun's own restarts)
    hosts: dict[str, dict[int, int]] = field(default_factory=dict)
    unreadable: int = 0  # files left out: not the wrapper's name, too big, not one pid a line

    @property
    def ended_on(self) -> int | None:
        """The restart the run ended on, as DISTRUN_RESTART counted it: distrun's restarts before
        this attempt plus its last start's restarts in place (None when nothing was reported)."""
        most = max((n for ranks in self.hosts.values() for n in ranks.values()), default=0)
        return self.attempt + most - 1 if most else None

    def as_dict(self) -> dict[str, Any]:
        return {"reported_by": "the job", "attempt": self.attempt, "ended_on_restart": self.ended_on,
                "hosts": {h: {"starts": max(r.values()), "local_ranks": {str(k): v for k, v in sorted(r.items())}}
                          for h, r in sorted(self.hosts.items())},
                "unreadable_files": self.unreadable}


def _count(path: Path) -> int | None:
    """Starts in one file: its lines, each a process id; None when it is anything else."""
    data = rundir.read_job_file(path, MAX_BYTES)
    if data is None:
        return None
    lines = data.decode("ascii", errors="replace").splitlines()
    return len(lines) if lines and all(_PID.fullmatch(line) for line in lines) else None


def collected(nodes: Path) -> Starts | None:
    """The starts of the last attempt in a collected copy (``nodes/<host>/...``); None when the run
    left none there (a launcher that does not restart in place, or nothing collected). On a shared
    folder every node's copy holds every node's files: each file is counted once, by its name."""
    if not nodes.is_dir():
        return None
    rel = rundir.collected_attempt(nodes)
    attempt = int(rel.rsplit("/", 1)[1]) if rel else 0
    files = sorted(nodes.glob(f"*/{rel + '/' if rel else ''}{rundir.STARTED}/{rundir.STARTS_PREFIX}*"))
    if not files:
        return None
    starts = Starts(attempt)
    seen: set[str] = set()
    for path in files[:MAX_FILES]:
        if path.name in seen:
            continue
        seen.add(path.name)
        name, n = _NAME.fullmatch(path.name), _count(path)
        if name is None or n is None:
            starts.unreadable += 1
            continue
        ranks = starts.hosts.setdefault(name[1], {})
        ranks[int(name[2])] = max(ranks.get(int(name[2]), 0), n)
    starts.unreadable += max(0, len(files) - MAX_FILES)
    return starts
