"""'distrun check --bandwidth': workloads/allreduce_bw.py started on every rank exactly as
'distrun train --script' starts a program (the same plan, preflight, claim on the hosts, rank
wrapper with each node's interface in GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, launcher, record),
and its result read back and judged (distrun.preflight.bandwidth)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from distrun import paths
from distrun.errors import ExitCode
from distrun.preflight.bandwidth import PROGRAM, Measurement, Verdict, judge, read
from distrun.run.listener import Listener


@dataclass
class Outcome:
    code: int  # the run's exit code (train's): 0 when the program ran to its end
    run_id: str | None
    run_dir: Path | None
    measured: Measurement | None = None  # None when the run failed
    verdict: Verdict | None = None

    @property
    def exit_code(self) -> int:
        """check's: the run's own failure, else 1 when a node or pair is far below the rest."""
        if self.code:
            return self.code
        return ExitCode.OK if self.verdict is not None and self.verdict.ok else ExitCode.FAILED


def program() -> Path:
    return paths.project_dir() / "workloads" / PROGRAM


def program_args(max_bytes: str | None) -> tuple[str, ...]:
    """What the program is told: its largest message (its own default otherwise)."""
    return ("--max-bytes", max_bytes) if max_bytes else ()


def measure(inventory: Path, launcher: str, listener: Listener, max_bytes: str | None = None) -> Outcome:
    """Run the all-reduce program on every rank the inventory gives and judge what it measured.
    ``listener`` keeps the run it is told of in ``.run`` (ui.run.TrainView does)."""
    from distrun.planning.jobplan import from_json
    from distrun.planning.request import JobRequest, LaunchRequest, ProgramRequest
    from distrun.run.train import run_job

    request = JobRequest(inventory=inventory, program=ProgramRequest(script=program(), args=program_args(max_bytes)),
                         launch=LaunchRequest(launcher=launcher))
    code = run_job(request, listener)
    run = getattr(listener, "run", None)
    out = Outcome(code, run.id if run else None, run.dir if run else None)
    if code or run is None:
        return out
    try:
        result = json.loads((run.dir / "result.json").read_text())
    except (OSError, ValueError):
        result = None
    plan = from_json(json.loads((run.dir / "plan.json").read_text()))
    out.measured = read(result, [h.name for h in plan.placement.hosts])
    out.verdict = judge(out.measured)
    return out
