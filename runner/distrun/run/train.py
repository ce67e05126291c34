"""One training run, end to end: claim the hosts, then each attempt planned, preflighted, staged
and launched in one playbook (launching.py), follow the ranks (or detach once they all started),
restart after a failure while restarts are left, stop and collect, summarise. Prints nothing: it
reports through a ``Listener`` (listener.py), which the UI implements; a bare Listener runs silently.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

from distrun import terminating
from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.planning.bundle import stage_vars
from distrun.planning.request import JobRequest, facts_unusable, load, load_noting, make_plan, network, without
from distrun.run.busy import Pending, claim_hosts
from distrun.run.diagnosis import failed_host
from distrun.run.ending import RunEnd, collect_limits
from distrun.run.follow import Outcome
from distrun.run.launching import Launching
from distrun.run.listener import EventHandler, Listener
from distrun.run.liveness import out_of_contact, probe, wait_started
from distrun.run.restarts import decide
from distrun.run.staging import Upload, discard
from distrun.store.runs import Phases, RunStatus, new_run, new_run_id
from distrun.transport import handshake as hs
from distrun.transport.early_playbook import EarlyPlaybook

__all__ = ["EventHandler", "Listener", "collect_limits", "run_job", "run_partition_only"]
# How long --detach waits for every rank to start before it lets the run go anyway.
DETACH_WAIT_S = 600


class _Run(Launching):
    """One run's attempts, followed to their end: what the attempts share (``Launching``), and
    what the run's end needs, the hosts lost and whether it was left running."""

    def __init__(self, request: JobRequest, listener: Listener, phases: Phases, cluster: Cluster,
                 claim: Pending | None = None, early: EarlyPlaybook | None = None) -> None:
        super().__init__(request, listener, phases, cluster, claim, early)
        self.end = RunEnd(self.run, request.inventory, listener)
        self.lost: set[str] = set()  # hosts that stopped answering: not waited on again
        self.left_running = False  # detached, or out of contact: nothing to stop or collect here

    def cancel_early(self) -> None:
        """The early ansible-playbook, where no playbook took it: stopped, having run nothing."""
        if self.early is not None:
            self.early.cancel()
            self.early = None

    def detach(self) -> bool:
        """--detach: wait until every rank started, then let the run go on by itself. False when
        it ended before that (it is then followed to its end here, like any run)."""
        assert self.plan is not None
        state = wait_started(self.cluster, self.plan, DETACH_WAIT_S)
        if state.state != RunStatus.RUNNING:
            return False
        self.run.let_go()
        self.left_running = True
        self.listener.detached(self.run, state)
        return True

    def out_of_contact(self) -> str | None:
        """After a node was lost: why no launch host answers any more (this machine's network, or
        the head, is gone), or None when the launch hosts still answer."""
        assert self.plan is not None
        return out_of_contact(self.plan, probe(self.cluster, self.plan, lost=self.lost), self.lost)

    def stop(self) -> None:
        if self.plan is not None and not self.stopped:
            if self.starter is not None:
                self.starter.join()  # a launcher still being started is stopped too, not left behind
            self.lost |= self.end.stop(self.plan, [h for h in self.limit if h not in self.lost])
            self.stopped = True
            self.phases.mark("stop")

    def restart_after(self, outcome: Outcome) -> bool:
        """Stop what is left of a failed attempt and prepare the next, while restarts are left."""
        request, plan = self.request, self.plan
        assert plan is not None
        if self.restart >= request.max_restarts:
            return False
        self.stop()
        failed = outcome.host if outcome.lost else (failed_host(self.end.lines, launcher_named(plan.launch.launcher)) or outcome.host)
        decision = decide(self.cluster, plan, request.np, failed=failed, lost=self.lost, exclude_failed=request.exclude_failed)
        if not decision.ok:
            self.listener.not_restarting(decision.refused)
            return False
        # The record keeps each failed attempt's plan; its output stays in launcher.log, and its
        # files on the nodes in its own folder (rundir.py), brought home with the next attempt's.
        self.run.write(f"attempts/{self.restart}/plan.json", (self.run.dir / "plan.json").read_text())
        self.end.lines.clear()
        self.restart += 1
        self.exclude = decision.exclude
        self.run.meta.restarts = self.restart
        self.run.save()
        left = [n.name for n in without(self.cluster, set(self.exclude)).workers]
        self.listener.restarting(self.restart, request.max_restarts, left, outcome.reason or f"the launcher exited {outcome.rc}")
        self.phases.mark("restart")
        return True

    def execute(self) -> int:
        request, run, phases, listener = self.request, self.run, self.phases, self.listener
        listener.started(run)
        phases.mark("load inventory")
        if request.preflight and facts_unusable(self.cluster):
            # First run against these nodes: the plan needs their interfaces and GPUs, so gather
            # facts first; later runs plan from the cache and run.yml verifies it still holds.
            self.preflight(self.cluster)
            self.cluster = load(request)
            phases.mark("gather facts (first run)")
        started = time.monotonic()
        rc: int | None = None
        interrupted = False
        try:
            while True:
                rc = self.launch()
                if rc == 4:
                    return 4
                if rc is not None or (request.detach and self.detach()):
                    break
                assert self.plan is not None
                outcome = self.end.follow(self.cluster, self.plan)
                phases.mark("follow (ranks run)")
                rc = outcome.rc
                if rc == 0:
                    break
                if outcome.lost and outcome.host:
                    self.lost.add(outcome.host)
                    why = self.out_of_contact()
                    if why is not None:
                        self.left_running = True
                        run.let_go()
                        listener.contact_lost(run, why)
                        return ExitCode.CONTACT_LOST
                if outcome.host:
                    listener.node_failed(outcome.reason)
                    self.end.lines.append(f"DISTRUN_FAILED_HOST {outcome.host} {outcome.reason}")
                if not self.restart_after(outcome):
                    break
        except KeyboardInterrupt:
            interrupted = True
            listener.interrupted()
        finally:
            self.cancel_early()
            if self.plan is not None and not self.left_running and (self.launched or (interrupted and not self.unstaged)):
                if interrupted or rc is None or rc != 0:
                    # A lost node is left out: Ansible would wait its connect timeout for it, and its
                    # ranks lose their peers and the head's orted with it.
                    self.stop()
                self.end.collect(self.cluster, self.plan, self.used, self.lost)
                phases.mark("collect")
        if self.left_running:
            return 0
        if interrupted:  # Ctrl-C (130), or SIGTERM/SIGHUP taken the same way (143)
            run.finish(terminating.exit_code(), terminating.word(), status=RunStatus.STOPPED)
            return terminating.exit_code()
        assert rc is not None and self.plan is not None
        code = self.end.summarise(rc, time.monotonic() - started, self.plan)
        phases.mark("summary")
        return code


def run_job(request: JobRequest, listener: Listener | None = None, early: EarlyPlaybook | None = None,
            t0: float | None = None) -> int:
    """Run a training job to its end (or, with request.detach, until every rank started);
    distrun's exit code. ``early``: run.yml already started for this run (the caller started it
    before its own imports), ``t0`` when the caller started (time.monotonic)."""
    t0 = time.monotonic() if t0 is None else t0
    early = early or EarlyPlaybook.for_training_run(request.inventory, bool(request.workdir))
    run_id = early.run_id if early is not None and early.run_id else new_run_id("train")
    listener = listener or Listener()
    try:
        cluster, left_out = load_noting(request)  # a bad inventory leaves no record
        for line in left_out:  # drained workers: the run goes on without them, and says so first
            listener.warn(line)
        launcher_named(request.launcher).require_ready(cluster)
        collect_limits()  # a bad limit is refused before anything starts
        hosts = claim_hosts(request, cluster, run_id)  # a plan error leaves no record either
    except BaseException:
        if early is not None:
            early.discard()
        raise
    # Claimed while ansible-playbook starts; run.yml stages nothing before the answer (its gate).
    claim = Pending(cluster, hosts, run_id, allow=request.allow_concurrent)
    steps: _Run | None = None
    try:
        phases = Phases(new_run("train", request.inventory, run_id, made=early is not None), t0)
        claim.gate(phases.run.dir / hs.CLAIM_GATE)
        phases.run.meta.max_restarts = request.max_restarts
        phases.run.meta.collected = False
        phases.run.save()
        try:
            steps, early = _Run(request, listener, phases, cluster, claim, early), None
            return steps.execute()
        except UserError as exc:
            if steps is not None:
                steps.cancel_early()  # before its record may be removed
            if claim.refused:  # busy hosts leave no record: nothing ran, nothing was staged
                shutil.rmtree(phases.run.dir, ignore_errors=True)
                raise UserError(f"{exc} (run {run_id} did not start)", exit_code=exc.exit_code) from None
            if phases.run.meta.status == RunStatus.RUNNING:  # the record says why
                phases.run.finish(exc.exit_code, str(exc))
            raise
        except Exception as exc:
            if phases.run.meta.status == RunStatus.RUNNING:
                phases.run.finish(1, f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            if phases.run.dir.is_dir():
                phases.save()
    finally:
        for left in (early, steps.early if steps is not None else None):
            if left is not None:
                left.cancel()
        claim.release()


def run_partition_only(request: JobRequest, listener: Listener | None = None) -> int:
    """Partition the graph on the head node for the request's world size; 0 or 1."""
    cluster = load(request)
    run_id = new_run_id("partition")
    # A bad --np is refused before the record exists: no record is left saying "running".
    plan = make_plan(JobRequest(**{**asdict(request), "workload": "gcn", "script": None}), cluster, run_id, network(cluster))
    assert plan.program.partition is not None
    run = new_run("partition", request.inventory, run_id)
    try:
        steps = _Run(request, listener or Listener(), Phases(run), cluster)
        extravars = {**stage_vars(plan, run, {}, {}, None, jittor_warm=False), "distrun_stage_hosts": [cluster.head.name],
                     hs.UPLOAD_GATE_VAR: str(run.dir / "upload")}
        upload = Upload(cluster, [cluster.head.name], run.id, Path(extravars["distrun_run_bundle"]), "", run.dir / "upload")
        result = steps.playbook("partition", "playbooks/stage.yml", [cluster.head.name], extravars, limit=cluster.head.name)
        upload.join()
        if not result.ok:
            discard(cluster, [cluster.head.name], run.id)
    finally:
        if run.meta.status == RunStatus.RUNNING:
            run.finish(1, "interrupted before the partition ended")
    run.finish(0 if result.ok else 1)
    return 0 if result.ok else 1
