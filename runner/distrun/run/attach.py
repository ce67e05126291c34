"""'distrun attach': take over a run nothing follows any more (a detached run, or one whose
distrun process died) and follow it to its end as 'distrun train' would: its output live, every
node's fate, then stop what is left of a failed run, collect, and record how it ended.

Ctrl-C leaves the run running (attach did not start it); 'distrun stop' stops it.
"""

from __future__ import annotations

import time
from pathlib import Path

from distrun import paths
from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import load_cluster
from distrun.run.diagnosis import NodeFailure
from distrun.run.ending import LOST_MID_RUN, RunEnd
from distrun.run.listener import Listener
from distrun.run.liveness import UNREACHABLE, read, recorded_plan
from distrun.store import controller
from distrun.store.runs import RunStatus, load_run


def attach(run_ref: str, listener: Listener | None = None) -> int:
    """Follow a train run to its end and collect it; distrun's exit code for the run."""
    listener = listener or Listener()
    run = load_run(run_ref, verb="train")
    if run.meta.verb != "train":
        raise UserError(f"run {run.id} is a '{run.meta.verb}' run: only train runs can be attached to")
    if run.meta.status != RunStatus.RUNNING and run.meta.collected:
        listener.already_ended(run)
        return 1 if run.meta.rc is None else run.meta.rc
    if run.meta.status == RunStatus.RUNNING and controller.alive(run.meta.controller):
        raise UserError(f"run {run.id} is followed by distrun ({controller.describe(run.meta.controller)}); "
                        f"read its output with 'distrun logs -f {run.id}'")
    plan = recorded_plan(run)
    inventory = Path(run.meta.inventory)
    cluster = load_cluster(inventory, paths.fact_cache_dir(inventory))
    state = read(cluster, plan)
    if state.state == UNREACHABLE:
        raise UserError(f"run {run.id}: {state.reason}; the run may still be going: attach again when its nodes answer",
                        exit_code=ExitCode.CONTACT_LOST)
    run.follow_here()
    listener.attached(run)
    end = RunEnd(run, inventory, listener)
    hosts = list(plan.placement.watched_hosts)
    started = time.monotonic()
    lost: set[str] = set()
    if state.state == RunStatus.LOST:
        # Nothing to follow: bring home what the nodes kept, and say so in the record.
        end.collect(cluster, plan, hosts, lost)
        run.meta.status, run.meta.summary, run.meta.controller = RunStatus.LOST, f"lost: {state.reason}", None
        run.save()
        raise UserError(f"run {run.id} is lost: {state.reason}; what its nodes kept is in {run.dir / 'nodes'}", exit_code=ExitCode.FAILED)
    try:
        outcome = end.follow(cluster, plan)
    except KeyboardInterrupt:
        run.let_go()
        raise
    if outcome.lost and outcome.host:
        lost.add(outcome.host)
        after = read(cluster, plan, lost)
        end.drain_lost(lost, [h for h, s in after.hosts.items() if s.reached], LOST_MID_RUN)
        if after.state == UNREACHABLE:
            run.let_go()
            listener.contact_lost(run, after.reason)
            return ExitCode.CONTACT_LOST
    if outcome.rc != 0:
        if outcome.host:
            listener.node_failed(outcome.reason)
            end.failure = NodeFailure(outcome.host, outcome.reason)
        head = plan.placement.head.name
        lost |= end.stop(plan, [h for h in dict.fromkeys([head, *hosts]) if h not in lost])
    end.collect(cluster, plan, hosts, lost)
    return end.summarise(outcome.rc, time.monotonic() - started, plan)
