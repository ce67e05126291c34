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

from distrun import paths
from distrun.errors import ExitCode, UserError
from distrun.inventory import contract
from distrun.inventory.cluster import Cluster, load_cluster
from distrun.launchers import LAUNCHERS, launcher_named
from distrun.launchers.base import fill
from distrun.planning.jobplan import JobPlan
from distrun.run.diagnosis import rank_logs
from distrun.run.liveness import UNREACHABLE, ClusterState, read, recorded_plan
from distrun.store import controller, retiring
from distrun.store.runs import Run, RunStatus, load_run
from distrun.transport import rundir
from distrun.transport.remote import as_user, shell_argv

# Seconds between two reads of a run's nodes while following a run nothing else follows.
ASK_EVERY_S = 5


def rank_host(plan: dict[str, Any], rank: int) -> tuple[str, int] | None:
    """(host, local rank) of a rank in a recorded plan, in the order the launcher gives its hosts
    ranks (plan order where its scheduler decides at run time: Slurm)."""
    name = str(plan.get("launcher"))
    hosts = [h for h in plan.get("hosts", []) if isinstance(h, dict)]
    launcher = launcher_named(name if name in LAUNCHERS else "mpirun")
    for host, ranks in fill(launcher.rank_order(hosts) or hosts).items():
        if rank in ranks:
            return host, ranks.index(rank)
    return None


def remote_log_command(plan: dict[str, Any], rank: int) -> str | None:
    """Shell command that waits for a rank's log on its node, then follows it."""
    where = rank_host(plan, rank)
    if where is None:
        return None
    host, local = where
    name = str(plan.get("launcher"))
    launcher = launcher_named(name if name in LAUNCHERS else "mpirun")
    # The recorded plan's attempt's folder (the top where plan.json lacks attempt_dirs: store/retiring.py).
    attempt = rundir.folder(int(plan.get("restart") or 0), bool(plan.get("attempt_dirs", retiring.ATTEMPT_DIRS_WHEN_MISSING)))
    pattern = f"{attempt}/{launcher.rank_log(rank, host, local)}" if attempt else launcher.rank_log(rank, host, local)
    run_dir = rundir.run_dir(str(plan["shared_dir"]), str(plan["run_id"]))
    user = str(plan.get("user") or contract.default("distrun_user"))
    d = shlex.quote(run_dir)
    # As the training user, as the launchers: the run dir may be open to that user only (sshfs).
    return as_user(user, (
        f"cd {d} 2>/dev/null || {{ echo \"{host}: cannot enter {run_dir} as user {user}\" >&2; exit 3; }}; "
        f"for i in $(seq 1200); do "
        f"f=$(ls -1 {pattern} 2>/dev/null | tail -n 1); [ -n \"$f\" ] && break; sleep 0.5; done; "
        f"[ -n \"$f\" ] || {{ echo \"{host}: no log of rank {rank} in {run_dir} after 10 minutes\" >&2; exit 4; }}; "
        f"exec tail -n +1 -F -s 0.5 \"$f\""))


class _Watch:
    """Whether a run still runs: its record while a live distrun process follows it, else its
    nodes, asked every few seconds (a record nothing follows never changes by itself)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.next_ask = 0.0
        self.last = True

    def followed(self) -> bool:
        self.run.reload()
        return self.run.meta.status == RunStatus.RUNNING and controller.alive(self.run.meta.controller) is True

    def running(self) -> bool:
        self.run.reload()
        if self.run.meta.status != RunStatus.RUNNING:
            return False
        if controller.alive(self.run.meta.controller):
            return True
        if time.monotonic() >= self.next_ask:
            self.next_ask = time.monotonic() + ASK_EVERY_S
            state = live_state(self.run)
            if state.state == UNREACHABLE:  # not an end: nothing can be said, and that is a failure
                raise UserError(f"run {self.run.id}: {state.reason}; the run may still be going: 'distrun status "
                                f"{self.run.id}' when its nodes answer", exit_code=ExitCode.CONTACT_LOST)
            self.last = state.state == RunStatus.RUNNING
        return self.last


def live_state(run: Run) -> ClusterState:
    """The run read from its nodes; UserError when they cannot be read."""
    plan = recorded_plan(run)
    return read(_cluster(run), plan)


def _cluster(run: Run) -> Cluster:
    inventory = Path(run.meta.inventory)
    return load_cluster(inventory, paths.fact_cache_dir(inventory))


def log_text(run_id: str, rank: int | None, follow: bool) -> Iterator[str]:
    """The launcher's log (rank None) or one rank's, as it grows while ``follow`` and the run runs."""
    run = load_run(run_id, verb="train")
    if run.meta.verb != "train":
        ansible = run.dir / "ansible.log"
        raise UserError(f"run {run.id} is a '{run.meta.verb}' run: 'distrun logs' reads train runs; its Ansible log "
                        f"is {ansible} ('distrun show {run.id}' says what it did)")
    watch = _Watch(run)
    if rank is None:
        # The runner writes launcher.log as the run goes: following it is following the run,
        # while a distrun process follows it. Else the head's own log is followed.
        path = run.dir / "launcher.log"
        if follow and run.meta.status == RunStatus.RUNNING and not watch.followed():
            if path.is_file():
                yield path.read_text(errors="replace")
            yield from _remote_launcher(run, _head_lines(path))
            return
    else:
        logs = rank_logs(run.dir / "nodes")
        if rank not in logs and run.meta.status == RunStatus.RUNNING and follow:
            yield from _remote_rank(run, rank, watch)
            return
        if rank not in logs:
            have = ", ".join(str(r) for r in sorted(logs)) or "none"
            state = " (still running: add --follow to read it live from its node)" if run.meta.status == RunStatus.RUNNING else ""
            raise UserError(f"run {run.id}: no log for rank {rank} (ranks with logs: {have}){state}")
        path = logs[rank]
    if not path.is_file():
        raise UserError(f"run {run.id}: {path.name} does not exist yet")
    with path.open(errors="replace") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                yield chunk
            if not follow:
                break
            if not watch.followed():
                yield fh.read()  # what was written before the record changed
                if rank is None and run.meta.status == RunStatus.RUNNING:
                    # Its distrun process died while we followed: go on from the head.
                    yield from _remote_launcher(run, _head_lines(path))
                break
            time.sleep(0.5)


def _head_lines(path: Path) -> int:
    """Lines of the current attempt's head log already in the local launcher.log."""
    if not path.is_file():
        return 0
    lines = path.read_text(errors="replace").splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("DISTRUN_RESTART ")]
    return len(lines) - (marks[-1] + 1 if marks else 0)


def remote_launcher_command(plan: JobPlan, skip: int) -> str:
    """Follow the head launcher's log from line skip + 1 until the launcher exits."""
    head = plan.placement.head.name
    return as_user(plan.launch.user, (
        f"h={shlex.quote(head)}; d={shlex.quote(rundir.attempt_path(plan))}; "
        f"p={shlex.quote(rundir.launcher_pid(head))}; l={shlex.quote(rundir.launcher_log(head))}; "
        'cd "$d" 2>/dev/null || { echo "$h: cannot enter $d" >&2; exit 3; }; '
        'pid=$(cat "$p" 2>/dev/null) || pid=; '
        # No launcher pid: nothing will write the log any more; print it and end.
        f'case "$pid" in ""|*[!0-9]*) exec tail -n +{int(skip) + 1} "$l" 2>/dev/null;; esac; '
        f'exec tail -n +{int(skip) + 1} -F -s 0.5 --pid="$pid" "$l" 2>/dev/null'
    ))


def _remote_launcher(run: Run, skip: int) -> Iterator[str]:
    """The head's launcher log, live from the head, until the launcher ends; one line when the
    run is lost or its head does not answer."""
    plan = recorded_plan(run)
    cluster = _cluster(run)
    state = read(cluster, plan)
    if state.state == UNREACHABLE:
        raise UserError(f"run {run.id}: {state.reason}; the run may still be going: try again when its nodes answer",
                        exit_code=ExitCode.CONTACT_LOST)
    if state.state == RunStatus.LOST:
        raise UserError(f"run {run.id} is lost: {state.reason}", exit_code=ExitCode.FAILED)
    node = next(n for n in cluster.nodes if n.name == plan.placement.head.name)
    proc = subprocess.Popen(shell_argv(node, remote_launcher_command(plan, skip)), stdout=subprocess.PIPE, text=True,
                            bufsize=1, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        yield from proc.stdout
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()


def _remote_rank(run: Run, rank: int, watch: _Watch) -> Iterator[str]:
    """Tail a running rank's log on its own node until the run ends."""
    plan_file = run.dir / "plan.json"
    if not plan_file.is_file():
        raise UserError(f"run {run.id}: no plan.json yet (the run is still being planned); try again in a moment")
    plan = json.loads(plan_file.read_text())
    command = remote_log_command(plan, rank)
    if command is None:
        raise UserError(f"run {run.id}: rank {rank} does not exist (world size {plan.get('world_size')})")
    host, _ = rank_host(plan, rank) or ("", 0)
    # A site's Slurm: the rank's node is not reached; its log is in the shared folder, read on the login node.
    host = (plan.get("login") or {}).get("name") or host
    cluster = _cluster(run)
    node = next((n for n in cluster.nodes if n.name == host), None)
    if node is None:
        raise UserError(f"run {run.id}: host {host} of rank {rank} is no longer in inventory {run.meta.inventory}")
    proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1)
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
            if ended_at is None and not watch.running():
                ended_at = time.monotonic()
            # The last lines tail printed before the run was marked finished.
            if ended_at is not None and time.monotonic() - ended_at > 1.5:
                break
        if ended_at is None and proc.wait() != 0:  # tail ended while the run goes on: the node or ssh failed
            said = [ln.strip() for ln in (proc.stderr.read() if proc.stderr else "").splitlines() if ln.strip()]
            why = said[-1] if said else f"ssh exited {proc.returncode}"
            raise UserError(f"run {run.id}: rank {rank}'s log on {host} cannot be followed: {why}; the run may still "
                            f"be going: 'distrun status {run.id}', then try again",
                            exit_code=ExitCode.CONTACT_LOST if proc.returncode == 255 else ExitCode.FAILED)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
