"""A train run's logs: the launcher's, or one rank's, from the record or live from its node.

The functions yield text as it comes; the CLI writes it out.
"""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import contract, paths
from .diagnosis import rank_logs
from .errors import UserError
from .inventory import load_cluster
from .launchers import LAUNCHERS, launcher_named
from .remote import as_user, shell_argv
from .runs import Run, load_run


def rank_host(plan: dict[str, Any], rank: int) -> tuple[str, int] | None:
    """(host, local rank) of a rank in a recorded plan: ranks fill each host's slots in order."""
    first = 0
    for h in plan.get("hosts", []):
        if rank < first + int(h["slots"]):
            return str(h["name"]), rank - first
        first += int(h["slots"])
    return None


def remote_log_command(plan: dict[str, Any], rank: int) -> str | None:
    """Shell command that waits for a rank's log on its node, then follows it."""
    where = rank_host(plan, rank)
    if where is None:
        return None
    host, local = where
    name = str(plan.get("launcher"))
    launcher = launcher_named(name if name in LAUNCHERS else "mpirun")
    pattern = launcher.rank_log(rank, host, local)
    run_dir = f"{str(plan['shared_dir']).rstrip('/')}/runs/{plan['run_id']}"
    user = str(plan.get("user") or contract.default("distrun_user"))
    d = shlex.quote(run_dir)
    # As the training user, as the launchers: the run dir may be open to that user only (sshfs).
    return as_user(user, (
        f"cd {d} 2>/dev/null || {{ echo \"{host}: cannot enter {run_dir} as user {user}\" >&2; exit 3; }}; "
        f"for i in $(seq 1200); do "
        f"f=$(ls -1 {pattern} 2>/dev/null | tail -n 1); [ -n \"$f\" ] && break; sleep 0.5; done; "
        f"[ -n \"$f\" ] || {{ echo \"{host}: no log of rank {rank} in {run_dir} after 10 minutes\" >&2; exit 4; }}; "
        f"exec tail -n +1 -F -s 0.5 \"$f\""))


def log_text(run_id: str, rank: int | None, follow: bool) -> Iterator[str]:
    """The launcher's log (rank None) or one rank's, as it grows while ``follow`` and the run runs."""
    run = load_run(run_id, verb="train")
    if rank is None:
        # The runner writes launcher.log as the run goes: following it is following the run.
        path = run.dir / "launcher.log"
    else:
        logs = rank_logs(run.dir / "nodes")
        if rank not in logs and run.meta.status == "running" and follow:
            yield from _remote_rank(run, rank)
            return
        if rank not in logs:
            have = ", ".join(str(r) for r in sorted(logs)) or "none"
            state = " (still running: add --follow to read it live from its node)" if run.meta.status == "running" else ""
            raise UserError(f"run {run.id}: no log for rank {rank} (ranks with logs: {have}){state}")
        path = logs[rank]
    if not path.is_file():
        raise UserError(f"run {run.id}: {path.name} does not exist yet")
    with path.open(errors="replace") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                yield chunk
            if not follow or load_run(run.id).meta.status != "running":
                break
            time.sleep(0.5)


def _remote_rank(run: Run, rank: int) -> Iterator[str]:
    """Tail a running rank's log on its own node until the run ends."""
    plan_file = run.dir / "plan.json"
    if not plan_file.is_file():
        raise UserError(f"run {run.id}: no plan.json yet (the run is still being planned); try again in a moment")
    plan = json.loads(plan_file.read_text())
    command = remote_log_command(plan, rank)
    if command is None:
        raise UserError(f"run {run.id}: rank {rank} does not exist (world size {plan.get('world_size')})")
    host, _ = rank_host(plan, rank) or ("", 0)
    inventory = Path(run.meta.inventory)
    cluster = load_cluster(inventory, paths.fact_cache_dir(inventory))
    node = next((n for n in cluster.nodes if n.name == host), None)
    if node is None:
        raise UserError(f"run {run.id}: host {host} of rank {rank} is no longer in inventory {run.meta.inventory}")
    proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, text=True, bufsize=1)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        ended_at: float | None = None
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                yield line
            if ended_at is None and load_run(run.id).meta.status != "running":
                ended_at = time.monotonic()
            # The last lines tail printed before the run was marked finished.
            if ended_at is not None and time.monotonic() - ended_at > 1.5:
                break
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
