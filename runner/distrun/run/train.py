"""One training run, end to end (``Run``): its first attempt planned once (the claim takes its hosts,
and GPUs, from that plan), each attempt started (launching.py: planned, preflighted, staged and
launched in one playbook), its ranks followed (or let go once they all started, --detach), a restart
after a failure while restarts are left, stop and collect, summary. Prints nothing: it reports
through a ``Listener`` (listener.py), which the UI implements; a bare Listener runs silently."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.planning.attempt import AttemptPlan, plan_attempt
from distrun.planning.bundle import stage_vars
from distrun.planning.jobenv import env_file_warning
from distrun.planning.jobplan import JobPlan
from distrun.planning.network import facts_unusable
from distrun.planning.request import JobRequest, load, load_noting
from distrun.run.attempt import Attempt, End
from distrun.run.diagnosis import NodeFailure, failed_host
from distrun.run.ending import LOST_MID_RUN, RunEnd, collect_limits
from distrun.run.follow import Outcome
from distrun.run.launching import Launching
from distrun.run.listener import EventHandler, Listener
from distrun.run.liveness import out_of_contact, probe, wait_started
from distrun.run.pending import Pending, claimed_gpus, held_after_waiting, with_free_gpus
from distrun.run.playbooks import RunPlaybooks
from distrun.run.restarts import decide
from distrun.run.staging import Upload, discard
from distrun.run.stop import interruption
from distrun.store.runs import Phases, RunStatus, new_run, new_run_id
from distrun.transport import handshake as hs
from distrun.transport.early_playbook import EarlyPlaybook

__all__ = ["EventHandler", "Listener", "collect_limits", "run_job", "run_partition_only"]
# How long --detach waits for every rank to start before it lets the run go anyway.
DETACH_WAIT_S = 600


class Run:
    """One run: what its attempts share (the request, the record, the listener, the claim, the
    hosts any attempt used), its attempts in order, the hosts lost, whether it was left running."""

    def __init__(self, request: JobRequest, listener: Listener, phases: Phases, cluster: Cluster,
                 claim: Pending | None = None, early: EarlyPlaybook | None = None) -> None:
        self.request, self.listener, self.phases = request, listener, phases
        self.record, self.cluster, self.claim = phases.run, cluster, claim
        self.books = RunPlaybooks(request, self.record, listener, early)
        self.end = RunEnd(self.record, request.inventory, listener)
        self.launches: list[Launching] = []  # one per attempt, the current one last
        self.used: list[str] = []  # every host an attempt ran on
        self.exclude: frozenset[str] = frozenset()
        self.lost: set[str] = set()  # hosts that stopped answering: not waited on again
        self.left_running = False  # detached, or out of contact: nothing to stop or collect here
        self.stopped = False  # the current attempt was stopped already

    @property
    def attempts(self) -> list[Attempt]:
        return [launch.attempt for launch in self.launches]

    @property
    def current(self) -> Launching | None:
        return self.launches[-1] if self.launches else None

    @property
    def plan(self) -> JobPlan | None:
        return self.current.plan if self.current else None

    def launch(self, planned: AttemptPlan) -> End:
        """Start an attempt of the plan made for it."""
        launching = Launching(self.request, self.books, self.phases, self.listener, planned, self.claim)
        self.launches.append(launching)
        self.stopped = False
        self.used = list(dict.fromkeys([*self.used, *planned.hosts]))
        return launching.start()

    def first_plan(self) -> AttemptPlan:
        """A run on nodes whose facts were never gathered: the preflight gathers them (refusing the
        run when it fails), and the first attempt is planned again from them."""
        result = self.books.gather(self.cluster)
        if not result.ok:
            if self.claim is not None:
                self.claim.wait()  # busy hosts refuse the run before its preflight does
            self.record.finish(ExitCode.PREFLIGHT, "preflight failed")
            raise self.books.refusal(result)
        self.cluster = load(self.request)
        self.phases.mark("gather facts (first run)")
        return plan_attempt(self.request, self.cluster, self.record.id)

    def detach(self) -> bool:
        """--detach: wait until every rank started, then let the run go on by itself. False when
        it ended before that (it is then followed to its end here, like any run)."""
        assert self.plan is not None
        state = wait_started(self.cluster, self.plan, DETACH_WAIT_S)
        if state.state != RunStatus.RUNNING:
            return False
        self.record.let_go()
        self.left_running = True
        self.listener.detached(self.record, state)
        return True

    def out_of_contact(self) -> str | None:
        """After a node was lost: it is drained while another node answers; why no launch host
        answers any more (this machine's network, or the head, is gone), or None when they do."""
        assert self.plan is not None
        states = probe(self.cluster, self.plan, lost=self.lost)
        self.end.drain_lost(self.lost, [h for h, s in states.items() if s.reached], LOST_MID_RUN)
        return out_of_contact(self.plan, states, self.lost)

    def stop(self) -> None:
        current = self.current
        if current is not None and not self.stopped:
            if current.starter is not None:
                current.starter.join()  # a launcher still being started is stopped too, not left behind
            self.lost |= self.end.stop(current.plan, [h for h in current.hosts if h not in self.lost])
            self.stopped = True
            self.phases.mark("stop")

    def restart_after(self, outcome: Outcome) -> AttemptPlan | None:
        """Stop what is left of a failed attempt and plan the next, while restarts are left."""
        request, plan, restart = self.request, self.plan, len(self.launches) - 1
        assert plan is not None
        if restart >= request.policy.max_restarts:
            return None
        self.stop()
        failed = outcome.host if outcome.lost else failed_host(self.end.lines, launcher_named(plan.launch.launcher)) or outcome.host
        decision = decide(self.cluster, plan, request.placement.np, failed=failed, lost=self.lost,
                          exclude_failed=request.policy.exclude_failed)
        if not decision.ok:
            self.listener.not_restarting(decision.refused)
            return None
        # The record keeps each failed attempt's plan; its output stays in launcher.log, and its
        # files on the nodes in its own folder (rundir.py), brought home with the next attempt's.
        self.record.write(f"attempts/{restart}/plan.json", (self.record.dir / "plan.json").read_text())
        self.end.lines, self.end.failure = [], None
        self.exclude = decision.exclude
        self.record.meta.restarts = restart + 1
        self.record.save()
        planned = plan_attempt(request, self.cluster, self.record.id, restart=restart + 1, exclude=self.exclude)
        self.listener.restarting(restart + 1, request.policy.max_restarts, [n.name for n in planned.cluster.workers],
                                 outcome.reason or f"the launcher exited {outcome.rc}")
        self.phases.mark("restart")
        return planned

    def execute(self, first: AttemptPlan) -> int:
        """Start the first attempt of ``first`` and every restart, follow them to the run's end;
        distrun's exit code."""
        request, record, phases, listener = self.request, self.record, self.phases, self.listener
        listener.started(record)
        phases.mark("load inventory")
        started = time.monotonic()
        rc: int | None = None
        interrupted = False
        try:
            planned: AttemptPlan | None = first
            if request.policy.preflight and facts_unusable(self.cluster):
                # First run against these nodes: the plan needs their interfaces and GPUs, so gather
                # facts first; later runs plan from the cache and run.yml verifies it still holds.
                planned = self.first_plan()
            while planned is not None:
                end = self.launch(planned)
                if end == End.STAGING_FAILED:
                    return ExitCode.STAGING
                if end != End.LAUNCHED:
                    rc = ExitCode.LAUNCH
                    break
                if request.policy.detach and self.detach():
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
                        record.let_go()
                        listener.contact_lost(record, why)
                        return ExitCode.CONTACT_LOST
                if outcome.host:
                    listener.node_failed(outcome.reason)
                    self.end.failure = NodeFailure(outcome.host, outcome.reason)
                planned = self.restart_after(outcome)
        except KeyboardInterrupt:
            interrupted = True
            listener.interrupted()
        finally:
            self.books.cancel_early()
            current = self.current
            if current is not None and not self.left_running and (current.may_run or (interrupted and not current.cleaned)):
                if interrupted or rc is None or rc != 0:
                    # A lost node is left out: Ansible would wait its connect timeout for it, and its
                    # ranks lose their peers and the head's orted with it.
                    self.stop()
                self.end.collect(self.cluster, current.plan, self.used, self.lost)
                phases.mark("collect")
        if self.left_running:
            return ExitCode.OK
        if interrupted:  # 'distrun stop' or Ctrl-C (130), or SIGTERM/SIGHUP in its terminal (143)
            code, why = interruption(record)
            record.finish(code, why, status=RunStatus.STOPPED)
            return code
        assert rc is not None and self.plan is not None
        code = self.end.summarise(rc, time.monotonic() - started, self.plan)
        phases.mark("summary")
        return code


def run_job(request: JobRequest, listener: Listener | None = None, early: EarlyPlaybook | None = None,
            t0: float | None = None) -> int:
    """Run a training job to its end (or, with --detach, until every rank started); distrun's
    exit code. ``early``: run.yml already started for this run (the caller started it before its
    own imports), ``t0`` when the caller started (time.monotonic)."""
    t0 = time.monotonic() if t0 is None else t0
    early = early or EarlyPlaybook.for_training_run(request.inventory, bool(request.program.workdir))
    run_id = early.run_id if early is not None and early.run_id else new_run_id("train")
    listener = listener or Listener()
    try:
        cluster, left_out = load_noting(request)  # a bad inventory leaves no record
        for line in [*left_out, *filter(None, [env_file_warning(request.program.workdir)])]:  # drained workers, an open env file
            listener.warn(line)
        launcher_named(request.launch.launcher).require_ready(cluster)
        collect_limits()  # a bad limit is refused before anything starts
        request = with_free_gpus(request, cluster, run_id)  # --gpus N: each node's first N free GPUs
        first = plan_attempt(request, cluster, run_id)  # a plan error leaves no record either
        held = held_after_waiting(cluster, first, run_id, request.policy, listener.waiting)  # --wait: held, or refused
    except BaseException:
        if early is not None:
            early.discard()
        raise
    # The first attempt's hosts, claimed while ansible-playbook starts (--wait: held already); run.yml waits for it (its gate).
    claim = Pending(cluster, first.hosts, run_id, allow=request.policy.allow_concurrent, gpus=claimed_gpus(first), held=held)
    steps: Run | None = None
    try:
        phases = Phases(new_run("train", request.inventory, run_id, made=early is not None), t0)
        claim.gate(phases.run.dir / hs.CLAIM_GATE)
        phases.run.meta.max_restarts = request.policy.max_restarts
        phases.run.meta.collected = False
        phases.run.save()
        try:
            steps, early = Run(request, listener, phases, cluster, claim, early), None
            return steps.execute(first)
        except KeyboardInterrupt:  # before the run's own steps took it, or while they ended
            if phases.run.meta.status != RunStatus.RUNNING:
                raise
            code, why = interruption(phases.run)
            phases.run.finish(code, why, status=RunStatus.STOPPED)
            return code
        except UserError as exc:
            if steps is not None:
                steps.books.cancel_early()  # before its record may be removed
            if claim.refused:  # busy hosts leave no record: nothing ran, nothing was staged
                shutil.rmtree(phases.run.dir, ignore_errors=True)
                raise UserError(f"{exc} (run {run_id} did not start)", exit_code=exc.exit_code) from None
            if phases.run.meta.status == RunStatus.RUNNING:  # the record says why
                phases.run.finish(exc.exit_code, str(exc))
            raise
        except Exception as exc:
            if phases.run.meta.status == RunStatus.RUNNING:
                phases.run.finish(ExitCode.FAILED, f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            if phases.run.dir.is_dir():
                phases.save()
    finally:
        for left in (early, steps.books.early if steps is not None else None):
            if left is not None:
                left.cancel()
        claim.release()


def run_partition_only(request: JobRequest, listener: Listener | None = None) -> int:
    """Partition the graph on the head node for the request's world size; 0 or 1."""
    cluster = load(request)
    run_id = new_run_id("partition")
    # A bad --np is refused before the record exists: no record is left saying "running".
    plan = plan_attempt(request.partition_only(), cluster, run_id).plan
    assert plan.program.partition is not None
    record = new_run("partition", request.inventory, run_id)
    try:
        books = RunPlaybooks(request, record, listener or Listener(), None)
        extravars = {**stage_vars(plan, record, {}, {}, None, jittor_warm=False), "distrun_stage_hosts": [cluster.head.name],
                     hs.UPLOAD_GATE_VAR: str(record.dir / "upload")}
        upload = Upload(cluster, [cluster.head.name], record.id, Path(extravars["distrun_run_bundle"]), "",
                        record.dir / "upload")
        result = books.run("partition", "playbooks/stage.yml", [cluster.head.name], extravars, limit=cluster.head.name)
        upload.join()
        if not result.ok:
            discard(cluster, [cluster.head.name], record.id)
    finally:
        if record.meta.status == RunStatus.RUNNING:
            record.finish(ExitCode.FAILED, "interrupted before the partition ended")
    record.finish(ExitCode.OK if result.ok else ExitCode.FAILED)
    return ExitCode.OK if result.ok else ExitCode.FAILED
