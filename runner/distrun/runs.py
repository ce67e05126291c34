"""Run records: one private directory per run, with its plan, commands, artifacts and logs."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import paths
from .errors import UserError


@dataclass
class RunMeta:
    run_id: str
    verb: str
    inventory: str
    started: float
    status: str = "running"  # running, succeeded, failed, stopped
    rc: int | None = None
    finished: float | None = None
    summary: str = ""

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started


class Run:
    def __init__(self, directory: Path, meta: RunMeta) -> None:
        self.dir = directory
        self.meta = meta

    @property
    def id(self) -> str:
        return self.meta.run_id

    def save(self) -> None:
        tmp = self.dir / "meta.json.tmp"
        tmp.write_text(json.dumps(asdict(self.meta), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / "meta.json")

    def finish(self, rc: int, summary: str = "", status: str | None = None) -> None:
        self.meta.rc = rc
        self.meta.status = status or ("succeeded" if rc == 0 else "failed")
        self.meta.finished = time.time()
        self.meta.summary = summary
        self.save()

    def write(self, name: str, text: str, mode: int = 0o600) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(text)
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


def new_run(verb: str, inventory: Path) -> Run:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{verb}-{secrets.token_hex(2)}"
    directory = paths.runs_dir() / run_id
    directory.mkdir(mode=0o700)
    run = Run(directory, RunMeta(run_id=run_id, verb=verb, inventory=str(inventory), started=time.time()))
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
    runs = list_runs()
    exact = [r for r in runs if r.id == run_ref]
    matches = exact or [r for r in runs if r.id.startswith(run_ref) or r.id.endswith(run_ref)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(r.id for r in matches[:8]) + (f" and {len(matches) - 8} more" if len(matches) > 8 else "")
        raise UserError(f"run {run_ref!r} is ambiguous: it matches {shown}; give more of the id")
    raise UserError(f"run {run_ref!r} not found in {base}; 'distrun runs' lists them")


def list_runs() -> list[Run]:
    """Every readable record whose directory is a real folder named like a run id."""
    runs: list[Run] = []
    for directory in sorted(paths.runs_dir().iterdir()):
        if not RUN_ID_RE.fullmatch(directory.name) or directory.is_symlink() or not directory.is_dir():
            continue
        meta_file = directory / "meta.json"
        if meta_file.is_file() and not meta_file.is_symlink():
            try:
                data = json.loads(meta_file.read_text())
                # Records written by older versions may hold keys this one no longer has.
                meta = RunMeta(**{k: v for k, v in data.items() if k in _META_FIELDS})
            except (json.JSONDecodeError, TypeError, AttributeError):
                continue
            if meta.run_id != directory.name:
                continue  # a record copied or planted under another name: not this run
            runs.append(Run(directory, meta))
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
        if r.meta.status == "running" or now - r.meta.started < older_than_s:
            continue
        shutil.rmtree(r.dir)
        removed.append(r)
    return removed
