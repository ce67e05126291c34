"""Run records: one private directory per run, with its plan, commands, artifacts and logs."""

from __future__ import annotations

import json
import os
import re
import reprlib
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.errors import UserError
from distrun.store import controller

# The record's format. A reader takes the fields it knows from any format and ignores the rest;
# a record it cannot read names its format when that is newer than this one.
FORMAT = 1
# Written by 'distrun stop' before it signals the run's controller: the controller records the
# run as stopped by it, not as interrupted.
STOP_REQUEST = "stop-requested"


class RunStatus(StrEnum):
    """A run record's status, as its ``meta.json`` keeps it (text, so older and newer readers agree)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # by 'distrun stop', Ctrl-C or a signal
    LOST = "lost"  # nothing follows it and its nodes no longer tell its end


@dataclass
class RunMeta:
    run_id: str
    verb: str
    inventory: str
    started: float
    status: str = RunStatus.RUNNING
    rc: int | None = None
    finished: float | None = None
    summary: str = ""
    format: int = FORMAT
    # The distrun process following the run (controller.identity()); None once nothing follows
    # it (a detached run, or a finished one).
    controller: dict[str, Any] | None = None
    # Whether the run's files were brought home; a run that ended while detached was not yet.
    collected: bool = True
    restarts: int = 0  # restarts done so far
    max_restarts: int = 0
    # The nodes this run lost and drained (store/drained.py): node -> what the controller found.
    drained: dict[str, str] = field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started


class RecordError(UserError):
    """A run record that cannot be read: one line naming it, and what to do."""


_NUMBER = (int, float)
# What each field of meta.json must hold for this version to use it.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "verb": (str,), "inventory": (str,), "started": _NUMBER, "status": (str,),
    "rc": (int, type(None)), "finished": (*_NUMBER, type(None)), "summary": (str,), "format": (int,),
    "controller": (dict, type(None)), "collected": (bool,), "restarts": (int,), "max_restarts": (int,),
    "drained": (dict,),
}


def _holds(value: object, types: tuple[type, ...]) -> bool:
    # JSON's true/false are Python bools, which are ints too: a bool only where one is expected.
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def read_meta(directory: Path) -> RunMeta:
    """A record's meta.json, forward-compatibly: unknown keys are ignored, a missing optional one
    takes its default; anything else that is wrong is one RecordError line."""
    path = directory / "meta.json"
    if path.is_symlink() or not path.is_file():
        raise RecordError(f"run record {directory}: no meta.json; remove the folder (it holds no readable run)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RecordError(f"run record {path} is unreadable ({why}); remove {directory} or restore the file") from None
    fix = f"; remove {directory} or restore the file"
    if isinstance(data, dict) and isinstance(data.get("format"), int) and data["format"] > FORMAT:
        fix = f": it was written by a newer distrun (record format {data['format']}; this one reads {FORMAT}): upgrade distrun"
    if not isinstance(data, dict):
        raise RecordError(f"run record {path} holds no JSON object{fix}")
    for key, types in _FIELD_TYPES.items():
        if key in data and not _holds(data[key], types):
            raise RecordError(f"run record {path}: {key}={reprlib.repr(data[key])} is not what distrun expects{fix}")
    known = {k: v for k, v in data.items() if k in _META_FIELDS}
    if "format" not in data:
        known["format"] = 0  # written before records had a format
    missing = [f for f in ("run_id", "verb", "inventory", "started") if f not in known]
    if missing:
        raise RecordError(f"run record {path} lacks {', '.join(missing)}{fix}")
    meta = RunMeta(**known)
    if meta.run_id != directory.name:
        raise RecordError(f"run record {path} names run {meta.run_id!r}, not its folder's; it was copied or planted: remove it")
    return meta


class Run:
    def __init__(self, directory: Path, meta: RunMeta) -> None:
        self.dir = directory
        self.meta = meta

    @property
    def id(self) -> str:
        return self.meta.run_id

    def save(self) -> None:
        tmp = self.dir / "meta.json.tmp"
        paths.write_text(tmp, json.dumps(asdict(self.meta), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / "meta.json")

    def finish(self, rc: int, summary: str = "", status: str | None = None) -> None:
        self.meta.rc = rc
        self.meta.status = status or (RunStatus.SUCCEEDED if rc == 0 else RunStatus.FAILED)
        self.meta.finished = time.time()
        self.meta.summary = summary
        self.meta.controller = None
        self.save()

    def reload(self) -> Run:
        """The record as it is on disk now (another distrun process may have changed it)."""
        self.meta = read_meta(self.dir)
        return self

    def follow_here(self) -> None:
        """This process follows the run from now on: the record names it."""
        self.meta.controller = controller.identity()
        self.save()

    def let_go(self) -> None:
        """Nothing follows the run any more; it goes on by itself on the cluster."""
        self.meta.controller = None
        self.save()

    def ask_to_stop(self) -> None:
        """'distrun stop' asks: the controller that sees this stops the run as asked."""
        self.write(STOP_REQUEST, json.dumps({"by": controller.identity(), "at": time.time()}) + "\n")

    @property
    def stop_asked(self) -> bool:
        return (self.dir / STOP_REQUEST).is_file()

    def write(self, name: str, text: str, mode: int = 0o600) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths.write_text(path, text)
        path.chmod(mode)
        return path


class Phases:
    """Wall seconds of each step of a run, kept in timings.json of the run record: where a
    run's time went (the launch overhead benchmark reads it)."""

    def __init__(self, run: Run, t0: float | None = None) -> None:
        self.run = run
        self.t0 = time.monotonic() if t0 is None else t0
        self.last = self.t0
        self.spans: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.spans.append((name, round(now - self.last, 3)))
        self.last = now

    def save(self) -> None:
        data = {"phases": [{"name": n, "s": v} for n, v in self.spans], "total_s": round(self.last - self.t0, 3)}
        self.run.write("timings.json", json.dumps(data, indent=2) + "\n")


def new_run_id(verb: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{verb}-{secrets.token_hex(2)}"


def new_run(verb: str, inventory: Path, run_id: str | None = None, made: bool = False) -> Run:
    """A new record, followed by this process. ``made``: this process made its folder already
    (0700), for what it started before the record."""
    run_id = run_id or new_run_id(verb)
    directory = paths.runs_dir() / run_id
    directory.mkdir(mode=0o700, exist_ok=made)
    run = Run(directory, RunMeta(run_id=run_id, verb=verb, inventory=str(inventory), started=time.time(),
                                 controller=controller.identity()))
    run.save()
    return run


# A run id names a directory under the runs folder and nothing else: never a path.
RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[a-z]+-[0-9a-f]{4}$")
# What may be typed for a run: a whole id, a prefix of one ("20261123-0012") or its last
# part ("4f2a"). Letters, digits and '-' only, so no '/', '..' or shell meta-character.
_RUN_REF_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_DURATION_RE = re.compile(r"^(\d+)([smhdw])$")
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


_META_FIELDS = {f.name for f in fields(RunMeta)}


def check_run_ref(run_ref: str) -> str:
    """The reference itself when it can only name a run, else one line saying what a run is."""
    if run_ref in ("last", "latest") or _RUN_REF_RE.fullmatch(run_ref):
        return run_ref
    raise UserError(f"{run_ref!r} is not a run id: give an id from 'distrun runs' (like 20261123-001018-train-4630), "
                    "a unique prefix or suffix of one, or 'last'")


def load_run(run_ref: str, verb: str | None = None) -> Run:
    """The run a user named: 'last' (the newest run of ``verb``, any verb when None), a whole
    id, or a unique prefix or suffix of one. Never a path."""
    base = paths.runs_dir()
    check_run_ref(run_ref)
    if run_ref in ("last", "latest"):
        all_runs = [r for r in list_runs() if verb is None or r.meta.verb == verb]
        if not all_runs:
            what = f"{verb} runs" if verb else "runs"
            raise UserError(f"no {what} yet in {base}; start one with 'distrun train --inventory NAME'")
        return all_runs[-1]
    bad: dict[str, RecordError] = {}
    runs = list_runs(bad)
    names = [r.id for r in runs] + list(bad)
    exact = [n for n in names if n == run_ref]
    matches = exact or [n for n in names if n.startswith(run_ref) or n.endswith(run_ref)]
    if len(matches) == 1:
        if matches[0] in bad:
            raise bad[matches[0]]
        return next(r for r in runs if r.id == matches[0])
    if matches:
        shown = ", ".join(matches[:8]) + (f" and {len(matches) - 8} more" if len(matches) > 8 else "")
        raise UserError(f"run {run_ref!r} is ambiguous: it matches {shown}; give more of the id")
    raise UserError(f"run {run_ref!r} not found in {base}; 'distrun runs' lists them")


def list_runs(unreadable: dict[str, RecordError] | None = None) -> list[Run]:
    """Every readable record whose directory is a real folder named like a run id, oldest
    first; the others go into ``unreadable`` (folder name -> why), when given."""
    runs: list[Run] = []
    for directory in sorted(paths.runs_dir().iterdir()):
        if not RUN_ID_RE.fullmatch(directory.name) or directory.is_symlink() or not directory.is_dir():
            continue
        try:
            runs.append(Run(directory, read_meta(directory)))
        except RecordError as exc:
            if unreadable is not None:
                unreadable[directory.name] = exc
    runs.sort(key=lambda r: r.meta.started)
    return runs


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '2w', '45s' -> seconds."""
    m = _DURATION_RE.fullmatch(text.strip())
    if not m:
        raise UserError(f"--older-than {text!r}: write a number and a unit, like 30d, 12h, 90m, 2w or 45s")
    return int(m.group(1)) * _DURATION_S[m.group(2)]


def prune_runs(older_than_s: float, now: float | None = None) -> list[Run]:
    """Delete the records of finished runs started more than ``older_than_s`` ago; running
    ones stay. Returns the runs removed."""
    now = time.time() if now is None else now
    removed: list[Run] = []
    for r in list_runs():
        if r.meta.status == RunStatus.RUNNING or now - r.meta.started < older_than_s:
            continue
        shutil.rmtree(r.dir)
        removed.append(r)
    return removed
