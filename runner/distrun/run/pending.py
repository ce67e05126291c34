"""A run's claim on its hosts, taken in the background while the run starts (``Pending``): the
nodes' ssh masters opened first, then every host claimed (busy.py), the answer written to the
gate file run.yml's stage step waits for, and told to the attempt before that. With ``train
--wait`` the claim is taken first instead, tried again while another run holds the hosts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from distrun.errors import UserError
from distrun.inventory.cluster import Cluster
from distrun.planning.attempt import AttemptPlan
from distrun.planning.gpus import first_free_at_launch
from distrun.planning.request import JobRequest, RunPolicy
from distrun.run.busy import Claim, claim, free_gpus, refusal, try_claim, waiting_line
from distrun.run.staging import write_gate
from distrun.transport.remote import open_masters

# Seconds between two tries of a waiting run's claim (train --wait).
WAIT_POLL_S = 2.0


class Pending:
    """A run's claim, taken in the background while the run starts: the nodes' ssh masters are
    opened first (the claim, run.yml and the followers ride on them), then every host is claimed
    at once. ``gate(path)`` names the file the answer goes to ("held", "allowed" or "refused"),
    which run.yml waits for before it stages anything; ``wait()`` gives the answer here, raising
    the refusal."""

    def __init__(self, cluster: Cluster, hosts: list[str], run_id: str, *, allow: bool = False,
                 gpus: Mapping[str, tuple[int, ...]] | None = None, held: Claim | None = None) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._gate: Path | None = None
        self._held: Claim | None = held  # taken already (train --wait): only the ssh masters are opened
        self._error: UserError | None = None
        self._allow = allow
        self._gpus = dict(gpus or {})  # host -> the GPUs the run claims there (others: the whole host)
        self.masters = threading.Event()  # set once the ssh masters are open (or given up on)
        self.answered_at: float | None = None  # time.monotonic() of the answer
        self._told: list[Callable[[float], object]] = []  # called with answered_at once the hosts are held
        self._thread = threading.Thread(target=self._take, args=(cluster, hosts, run_id), daemon=True)
        self._thread.start()

    def _take(self, cluster: Cluster, hosts: list[str], run_id: str) -> None:
        try:
            try:
                open_masters(cluster.nodes)
            finally:
                self.masters.set()
            if not self._allow and self._held is None:
                self._held = claim(cluster, hosts, run_id, self._gpus)
        except UserError as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - any failure closes the gate, with its reason
            self._error = UserError(f"could not claim the run's hosts: {type(exc).__name__}: {exc}")
        with self._lock:  # told, then the gate file written, before anyone waiting is told the answer
            self.answered_at = time.monotonic()
            if self._error is None:
                for told in self._told:
                    told(self.answered_at)
            if self._gate is not None:
                self._write(self._gate)
            self._done.set()

    @property
    def refused(self) -> bool:
        return self._done.is_set() and self._error is not None

    def notify(self, told: Callable[[float], object]) -> None:
        """Call ``told(answered_at)`` once the run holds its hosts (now, if it does), before the gate
        file says so: run.yml stages nothing before the attempt knows."""
        with self._lock:
            if not self._done.is_set():
                self._told.append(told)
            elif self._error is None and self.answered_at is not None:
                told(self.answered_at)

    def gate(self, path: Path) -> None:
        """Write the answer to path once it is known (now, if it is)."""
        with self._lock:
            self._gate = path
            if self._done.is_set():
                self._write(path)

    def _write(self, path: Path) -> None:
        write_gate(path, "refused" if self._error is not None else ("allowed" if self._allow else "held"))

    def wait(self) -> None:
        """Block until the answer is known; raise the refusal (busy hosts name their runs)."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    def release(self) -> None:
        """Let the hosts go (after the claim's answer, which comes within its own timeouts)."""
        self._done.wait()
        if self._held is not None:
            self._held.release()


def claim_waiting(cluster: Cluster, hosts: list[str], run_id: str, gpus: Mapping[str, tuple[int, ...]],
                  bound_s: int, waiting: Callable[[str], object]) -> Claim:
    """``train --wait``: the claim, tried again every WAIT_POLL_S while another run holds the hosts
    or GPUs, for up to ``bound_s`` seconds: ``waiting(line)`` once, when the first try is refused,
    naming what is held and by which run; the refusal (exit 8) when the bound passed. Between
    tries nothing is held, and an interrupted try ends its claim (busy.try_claim)."""
    deadline = time.monotonic() + bound_s
    told = False
    while True:
        got = try_claim(cluster, hosts, run_id, gpus)
        if isinstance(got, Claim):
            return got
        if time.monotonic() >= deadline:
            exc = refusal(got, gpus, cluster.user)
            raise UserError(f"{exc} (waited {bound_s} s)", exit_code=exc.exit_code)
        if not told:
            waiting(waiting_line(got, bound_s))
            told = True
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


def held_after_waiting(cluster: Cluster, planned: AttemptPlan, run_id: str, policy: RunPolicy,
                       waiting: Callable[[str], object]) -> Claim | None:
    """``train --wait``: the first attempt's hosts held (claim_waiting) before run.yml is handed its
    arguments, so its gate never waits on the bound; None without --wait or with --allow-concurrent."""
    if policy.wait_s is None or policy.allow_concurrent:
        return None
    return claim_waiting(cluster, planned.hosts, run_id, claimed_gpus(planned), policy.wait_s, waiting)


def claimed_gpus(planned: AttemptPlan) -> dict[str, tuple[int, ...]]:
    """The GPUs the run claims on each host: those its plan gives its ranks there. A host where
    it uses none, or where a scheduler picks them (Slurm shares its nodes itself), is claimed whole."""
    return {h.name: h.gpu_ids for h in planned.plan.placement.hosts if h.gpu_ids and h.visible}


def with_free_gpus(request: JobRequest, cluster: Cluster, run_id: str) -> JobRequest:
    """``--gpus N`` without indices: each node's first N GPUs no live run holds (the nodes' claims
    asked, nothing taken), as if ``--hosts node:i,j`` had named them, so that the one plan of each
    attempt (restarts included) places the ranks on them and the claim takes exactly those. Two
    runs that ask at once may pick the same ones: the claim then refuses one, naming the other.
    Unchanged when there is nothing to pick (no count, every GPU asked, --allow-concurrent)."""
    placement, count = request.placement, request.placement.gpus
    asked = first_free_at_launch(cluster.nodes, count, (h for h, _ in placement.gpu_ids),
                                 allow_concurrent=request.policy.allow_concurrent)
    if not asked:
        return request
    free = free_gpus(cluster, asked, run_id)
    picked = tuple((h, ids[:count]) for h, ids in free.items() if count is not None and len(ids) >= count
                   and ids[:count] != tuple(range(count)))
    if not picked:
        return request
    return replace(request, placement=replace(placement, gpu_ids=(*placement.gpu_ids, *picked)))
