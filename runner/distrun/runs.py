"""Run records: one private directory per run, with its plan, commands, artifacts and logs."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    extra: dict[str, Any] = field(default_factory=dict)

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


def new_run(verb: str, inventory: Path) -> Run:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{verb}-{secrets.token_hex(2)}"
    directory = paths.runs_dir() / run_id
    directory.mkdir(mode=0o700)
    run = Run(directory, RunMeta(run_id=run_id, verb=verb, inventory=str(inventory), started=time.time()))
    run.save()
    return run


def load_run(run_id: str) -> Run:
    base = paths.runs_dir()
    if run_id in ("last", "latest"):
        all_runs = list_runs()
        if not all_runs:
            raise UserError(f"no runs yet in {base}; start one with 'distrun train --inventory NAME'")
        return all_runs[-1]
    directory = base / run_id
    if not (directory / "meta.json").is_file():
        matches = [r for r in list_runs() if r.id.startswith(run_id) or r.id.endswith(run_id)]
        if len(matches) == 1:
            return matches[0]
        raise UserError(f"run {run_id!r} not found in {base}; 'distrun runs' lists them")
    return Run(directory, RunMeta(**json.loads((directory / "meta.json").read_text())))


def list_runs() -> list[Run]:
    runs: list[Run] = []
    for directory in sorted(paths.runs_dir().iterdir()):
        meta_file = directory / "meta.json"
        if meta_file.is_file():
            try:
                runs.append(Run(directory, RunMeta(**json.loads(meta_file.read_text()))))
            except (json.JSONDecodeError, TypeError):
                continue
    runs.sort(key=lambda r: r.meta.started)
    return runs
