"""A run record checked against the truth: its controller's life, and else its nodes.

A record that says "running" is believed only while the distrun process that follows the run is
alive. Otherwise the run's nodes are asked (liveness.py) and the record is corrected: a run
that finished gets its real exit code (its logs still on the nodes until 'distrun attach'
collects them), a run whose launcher vanished is lost. A run whose nodes do not answer keeps
its record, shown as unreachable.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.errors import UserError
from distrun.inventory.cluster import Cluster, load_cluster
from distrun.launchers import launcher_named
from distrun.planning.jobplan import JobPlan
from distrun.run.liveness import UNREACHABLE, ClusterState, read, recorded_plan
from distrun.store import controller
from distrun.store.runs import Run, RunStatus


@dataclass
class RunView:
    """A run as it is now: the record, corrected by what its controller or its nodes say."""

    run: Run
    state: str
    detail: str = ""
    followed: bool | None = None  # its controller is alive (None: it runs on another machine)
    cluster: ClusterState | None = None  # what the nodes said, when they were asked

    @property
    def rc(self) -> int | None:
        """The launcher's exit code when the nodes were asked and it exited, else the record's."""
        return self.run.meta.rc if self.cluster is None or self.cluster.rc is None else self.cluster.rc

    def as_dict(self) -> dict[str, Any]:
        meta = self.run.meta
        out: dict[str, Any] = {
            "run_id": self.run.id, "verb": meta.verb, "state": self.state, "rc": self.rc, "detail": self.detail,
            "record": {"status": meta.status, "rc": meta.rc, "summary": meta.summary, "collected": meta.collected,
                       "restarts": meta.restarts, "max_restarts": meta.max_restarts},
            "controller": {**(meta.controller or {}), "alive": self.followed} if meta.controller else None,
        }
        if self.cluster is not None:
            out["world_size"] = self.cluster.world_size
            out["started_ranks"] = list(self.cluster.started)
            out["hosts"] = {h: {"reached": s.reached, "error": s.error, "run_dir": s.run_dir, "launcher": s.launcher,
                                "rc": s.rc, "processes": s.procs, "started_ranks": list(s.started)}
                            for h, s in self.cluster.hosts.items()}
            # A detached mpirun run's supervisor: the try it is in, as it reported it (run/supervision.py).
            out["supervisor"] = next((s.supervisor for s in self.cluster.hosts.values() if s.supervisor), None)
        return out


class ClusterCache:
    """Inventories read once per command: several records may name the same one."""

    def __init__(self) -> None:
        self._clusters: dict[str, Cluster | UserError] = {}
        self._lock = threading.Lock()

    def get(self, inventory: str) -> Cluster:
        with self._lock:
            if inventory not in self._clusters:
                path = Path(inventory)
                try:
                    self._clusters[inventory] = load_cluster(path, paths.fact_cache_dir(path))
                except UserError as exc:
                    self._clusters[inventory] = exc
            value = self._clusters[inventory]
        if isinstance(value, UserError):
            raise value
        return value


def view(run: Run, clusters: ClusterCache | None = None, *, ask_nodes: bool = False) -> RunView:
    """The run now. A finished record is shown as it is; a running one whose controller lives is
    believed (unless ``ask_nodes``); otherwise its nodes are asked and the record corrected."""
    meta = run.meta
    if meta.status != RunStatus.RUNNING:
        detail = meta.summary
        if not meta.collected:
            detail += f" (logs still on the nodes: 'distrun attach {run.id}' collects them)"
        return RunView(run, meta.status, detail.strip())
    followed = controller.alive(meta.controller)
    if meta.verb != "train":
        if followed is False:
            return _mark_lost(run, f"its distrun process ({controller.describe(meta.controller)}) ended before it finished")
        return RunView(run, RunStatus.RUNNING, f"followed by {controller.describe(meta.controller)}", followed)
    if followed and not ask_nodes:
        return RunView(run, RunStatus.RUNNING, f"followed by {controller.describe(meta.controller)}", followed)
    try:
        plan = recorded_plan(run)
    except UserError as exc:
        if followed is False:
            return _mark_lost(run, f"its distrun process ended before the run was launched ({exc})")
        return RunView(run, RunStatus.RUNNING, "being planned", followed)
    try:
        cluster = (clusters or ClusterCache()).get(meta.inventory)
    except UserError as exc:
        return RunView(run, UNREACHABLE, f"its inventory cannot be read: {exc}", followed)
    state = read(cluster, plan)
    who = (f"followed by {controller.describe(meta.controller)}" if followed
           else "no distrun process follows it" if followed is False
           else f"followed from another machine ({controller.describe(meta.controller)})")
    if state.state == RunStatus.RUNNING:
        started = f"{len(state.started)} of {plan.placement.world_size} rank(s) started"
        return RunView(run, RunStatus.RUNNING, f"{started}; {who}" + (f"; {state.reason}" if state.reason else ""),
                       followed, state)
    if state.state == UNREACHABLE:
        return RunView(run, UNREACHABLE, f"{state.reason}; the record says running ({who})", followed, state)
    if followed is not False:
        # Its controller is alive, or lives elsewhere: it will write the end itself.
        return RunView(run, RunStatus.RUNNING, f"ending: {state.reason}; {who}", followed, state)
    return _correct(run, plan, state)


def _correct(run: Run, plan: JobPlan, state: ClusterState) -> RunView:
    """Write what the nodes said into a record nothing follows any more (read again first: a
    controller may have just taken the run over)."""
    run.reload()
    if run.meta.status != RunStatus.RUNNING or controller.alive(run.meta.controller) is not False:
        return view(run)
    if state.state == RunStatus.LOST:
        return _mark_lost(run, state.reason, state)
    assert state.rc is not None
    run.meta.collected = False
    # The record keeps distrun's exit code, as 'distrun train' would have; the summary the launcher's.
    run.finish(launcher_named(plan.launch.launcher).exit_code(state.rc),
               f"{'ok' if state.rc == 0 else f'failed rc={state.rc}'}: ended while no distrun process followed it")
    return RunView(run, run.meta.status, run.meta.summary + f" (logs still on the nodes: 'distrun attach {run.id}' collects them)",
                   False, state)


def _mark_lost(run: Run, reason: str, state: ClusterState | None = None) -> RunView:
    run.meta.rc = None
    run.meta.status = RunStatus.LOST
    run.meta.summary = f"lost: {reason}"
    run.meta.controller = None
    run.save()
    return RunView(run, RunStatus.LOST, run.meta.summary, False, state)


def views(runs: list[Run]) -> dict[str, RunView]:
    """Every run now; the running ones are checked at once (their nodes asked where needed)."""
    clusters = ClusterCache()
    out = {r.id: RunView(r, r.meta.status, r.meta.summary) for r in runs if r.meta.status != RunStatus.RUNNING}
    pending = [r for r in runs if r.meta.status == RunStatus.RUNNING]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pending)))) as pool:
        for r, v in zip(pending, pool.map(lambda run: view(run, clusters), pending), strict=True):
            out[r.id] = v
    return out
