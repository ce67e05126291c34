"""Drained nodes: the nodes this controller keeps out of an inventory's runs, each with why, what
marked it and since when (Slurm's DRAIN state, kept on the controller).

What found a node unfit marks it: 'distrun check' when its GPUs are unhealthy (source
``check: gpu health``), a run that lost the node (source ``run <run id>``). The mark stays until
a check passes on the node (``undrain_passed``) or ``distrun check --clear NODE`` (``undrain``).
One JSON file per inventory (paths.drained_file), read and written whole under a lock, so a check
and a run that end at once both keep their marks. Marks are made by the controller from what it
judged; nothing a node or a job writes reaches this file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from distrun import paths
from distrun.errors import UserError

SOURCE_GPU_HEALTH = "check: gpu health"
MAX_REASON = 500  # characters kept of a reason (one line)


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str  # one line: what was found
    source: str  # what marked it: "check: gpu health", "run <run id>"
    since: float  # time.time() of the first mark
    updated: float  # time.time() of the last mark (a later check may find it again, or another fault)

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))

    def line(self) -> str:
        """One line a person reads: which node, since when, why, and how it comes back."""
        return (f"{self.node} is drained since {self.when()} ({self.source}: {self.reason}); a 'distrun check' that "
                f"passes on it, or 'distrun check --clear {self.node}', brings it back")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:MAX_REASON]


@contextlib.contextmanager
def _locked(inventory: Path) -> Iterator[Path]:
    dest = paths.drained_file(inventory)
    with open(dest.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield dest
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(dest: Path) -> dict[str, Drain]:
    try:
        text = dest.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"the drained nodes' file {dest} cannot be read ({exc.strerror}); fix its permissions") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        out = {}
        for node, d in data.items():
            out[node] = Drain(node=str(node), reason=str(d["reason"]), source=str(d["source"]),
                              since=float(d["since"]), updated=float(d.get("updated", d["since"])))
        return out
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UserError(f"the drained nodes' file {dest} is damaged ({exc}); remove it (every node then counts as "
                        "not drained) and run 'distrun check' again") from None


def _write(dest: Path, marks: dict[str, Drain]) -> None:
    data = {n: {k: v for k, v in d.as_dict().items() if k != "node"} for n, d in sorted(marks.items())}
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".drained-")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def drained(inventory: Path) -> dict[str, Drain]:
    """Node -> its mark, for every drained node of the inventory."""
    with _locked(inventory) as dest:
        return _read(dest)


def drain(inventory: Path, node: str, reason: str, source: str, now: float | None = None) -> Drain:
    """Mark ``node`` drained (again): the reason and source are the latest, ``since`` the first."""
    now = time.time() if now is None else now
    with _locked(inventory) as dest:
        marks = _read(dest)
        first = marks[node].since if node in marks else now
        marks[node] = Drain(node, _one_line(reason), _one_line(source), first, now)
        _write(dest, marks)
        return marks[node]


def undrain(inventory: Path, node: str) -> Drain | None:
    """Bring ``node`` back ('distrun check --clear NODE'): the mark removed, or None when it had none."""
    with _locked(inventory) as dest:
        marks = _read(dest)
        gone = marks.pop(node, None)
        if gone is not None:
            _write(dest, marks)
        return gone


def undrain_passed(inventory: Path, nodes: Iterable[str]) -> list[Drain]:
    """Bring back every node of ``nodes`` (those a full check passed on): the marks removed."""
    with _locked(inventory) as dest:
        marks = _read(dest)
        gone = [marks.pop(n) for n in sorted(set(nodes)) if n in marks]
        if gone:
            _write(dest, marks)
        return gone


def left_out(inventory: Path, names: Iterable[str]) -> tuple[list[str], list[Drain]]:
    """``names`` without the drained ones (order kept), and the marks of those left out: what a
    run's host choice uses, with one line per node left out (``Drain.line``)."""
    marks = drained(inventory)
    names = list(names)
    return [n for n in names if n not in marks], [marks[n] for n in names if n in marks]
