"""One training run, end to end: claim the hosts, plan, preflight, stage and launch in one
playbook, follow the ranks (or detach once they all started), restart after a failure while
restarts are left, stop and collect, summarise. Prints nothing: it reports through a
``Listener`` (listener.py), which the UI implements; a bare Listener runs silently.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

from . import containers, sshmesh, terminating
from . import handshake as hs
from .ansible_bridge import RUN_PLAYBOOK, EarlyPlaybook, PlaybookEvent, PlaybookResult, run_playbook
from .bundle import launch_scripts, needs_stage_steps, plan_files, record_plan, render_env_file, run_vars, stage_vars
from .busy import Pending, claim_hosts
from .check import preflight_refusal, preflight_vars
from .collect import collect_hosts
from .diagnosis import failed_host
from .ending import RunEnd, collect_limits
from .errors import ExitCode, UserError
from .follow import Outcome, Starter
from .inventory import Cluster
from .judge_report import from_dicts, network_changed
from .launchers import launcher_named
from .listener import EventHandler, Listener
from .liveness import out_of_contact, probe, wait_started
from .plan import JobPlan
from .planning import JobRequest, environment, facts_unusable, load, make_plan, network, without
from .project import commands, load_project, make_ready, pull_command, record_pulls
from .restarts import decide
from .runs import Phases, new_run, new_run_id
from .staging import UPLOADED, Upload, discard

__all__ = ["EventHandler", "Listener", "collect_limits", "run_job", "run_partition_only"]
# How long --detach waits for every rank to start before it lets the run go anyway.
DETACH_WAIT_S = 600


class _Run:
    """The steps of one run, with what they share: the request, the record, the listener, and
    what the attempts so far did (the plan, the hosts used and lost, restarts)."""

    def __init__(self, request: JobRequest, listener: Listener, phases: Phases, cluster: Cluster,
                 claim: Pending | None = None, early: EarlyPlaybook | None = None) -> None:
        self.request = request
        self.early = early  # run.yml's ansible-playbook, started before the run was planned
        self.claim = claim  # None: nothing claimed (a partition alone)
        self.listener = listener
        self.phases = phases
        self.run = phases.run
        self.cluster = cluster
        self.end = RunEnd(self.run, request.inventory, listener)
        self.plan: JobPlan | None = None
        self.limit: list[str] = []  # the head and the rank hosts of the current attempt
        self.used: list[str] = []  # every host an attempt ran on
        self.lost: set[str] = set()  # hosts that stopped answering: not waited on again
        self.exclude: frozenset[str] = frozenset()
        self.restart = 0
        self.launched = False  # once every node was staged, ranks may run: stop and collect
        self.unstaged = False  # interrupted before any rank started, what was staged removed: nothing to collect
        self.stopped = False  # the current attempt was stopped already
        self.left_running = False  # detached, or out of contact: nothing to stop or collect here
        self.starter: Starter | None = None  # the current attempt's
        self.attempt = hs.Attempt(0)  # the current attempt's states

    def playbook(self, title: str, playbook: str, hosts: list[str], extravars: dict,
                 limit: str | None = None, cached_facts: bool = False,
                 also: EventHandler | None = None, skip_tags: str | None = None) -> PlaybookResult:
        """Run a playbook with progress; ``also`` sees every event too."""
        started = time.monotonic()
        with self.listener.playbook(title, hosts) as on_event:

            def both(event: PlaybookEvent) -> None:
                # run.yml's judge failing the play is told by the refusal line, with the verdict.
                judged = event.kind == "failed" and hs.PREFLIGHT_FACT in (event.data.get("ansible_facts") or {})
                if on_event is not None and not judged:
                    on_event(event)
                if also is not None:
                    also(event)

            early, self.early = self.early, None
            if early is not None and early.playbook != playbook:
                early.cancel()  # another playbook comes first (a first run gathers facts): run.yml starts as usual
                early = None
            result = early.run(extravars=extravars, on_event=both, limit=limit, cached_facts=cached_facts,
                               skip_tags=skip_tags) if early is not None else None
            if result is None:
                result = run_playbook(playbook, self.request.inventory, self.run.dir, extravars=extravars,
                                      on_event=both, limit=limit, cached_facts=cached_facts, skip_tags=skip_tags)
        # A failed preflight is told in one line by the same judge as 'distrun check' (refuse_preflight);
        # an interrupted playbook by the run's end.
        if not result.ok and result.status != "canceled" and not (
                result.fact(hs.PREFLIGHT_FACT) is not None and hs.failed_step(result) == "preflight"):
            self.listener.playbook_failed(result, time.monotonic() - started)
        return result

    def preflight_vars(self) -> dict:
        return {"preflight_ports": [self.request.port], **preflight_vars(str(self.request.inventory), self.run.dir)}

    def preflight(self, cluster: Cluster) -> None:
        names = [n.name for n in cluster.nodes]  # --hosts/--exclude: only the run's nodes
        result = self.playbook("preflight", "playbooks/preflight.yml", names, self.preflight_vars(), limit=",".join(names))
        sshmesh.remember(self.request.inventory, result.fact(sshmesh.FACT))
        if not result.ok:
            self.refuse_preflight(result)

    def claimed(self) -> None:
        """Wait for the claim's answer: busy hosts refuse the run before anything else is said
        about it (a port the other run holds would otherwise fail the preflight first)."""
        if self.claim is not None:
            self.claim.wait()

    def refuse_preflight(self, result: PlaybookResult) -> None:
        self.claimed()
        self.run.finish(3, "preflight failed")
        raise UserError(preflight_refusal(result, str(self.request.inventory)), exit_code=3)

    def launch(self) -> int | None:
        """Plan this attempt, run run.yml (preflight, stage) and start the launchers: None once every
        launcher started, 4 when staging failed, 5 when the launch did. The states it reached go to
        the record (attempts/<n>/states.json)."""
        try:
            rc = self._launch()
            if rc is not None:
                self.attempt.reach(hs.State.STAGING_FAILED if rc == 4 else hs.State.LAUNCH_FAILED, self.run.meta.summary)
            return rc
        except UserError as refused:
            self.attempt.reach(hs.State.REFUSED, str(refused))
            raise
        except KeyboardInterrupt:
            self.attempt.reach(hs.State.INTERRUPTED)
            raise
        finally:
            self.run.write(f"attempts/{self.restart}/states.json", self.attempt.to_json())

    def _launch(self) -> int | None:
        request, run, phases = self.request, self.run, self.phases
        login = False  # the head logs in to every node even where a login was proved before
        for attempt in (1, 2):
            cluster = without(self.cluster, set(self.exclude))
            net = network(cluster)
            plan = make_plan(request, cluster, run.id, net, restart=self.restart)
            files, scripts = plan_files(plan), launch_scripts(plan)
            project = load_project(request.workdir, cluster.shared_dir) if request.workdir else None
            record_plan(run, plan, files, scripts, commands(cluster, plan, project) if project else None)
            self.plan, self.stopped, self.attempt = plan, False, hs.Attempt(self.restart)
            self.limit = list(dict.fromkeys([cluster.head.name, *plan.reached_hosts]))
            self.used = list(dict.fromkeys([*self.used, *self.limit]))
            env = environment(request, cluster)
            extravars = {**run_vars(plan, run, files, scripts, script=request.script, env=env, network=net,
                                    preflight=request.preflight,
                                    workdir_pull=pull_command(cluster, plan, project) if project else None),
                         **self.preflight_vars(),
                         "preflight_ssh_baseline": {} if login else sshmesh.baseline(request.inventory, cluster.head.name),
                         hs.CLAIM_GATE_VAR: str(run.dir / hs.CLAIM_GATE) if self.claim is not None else ""}
            mode = cluster.shared_fs_mode
            steps = needs_stage_steps(extravars, mode)
            # A first attempt without stage steps is staged by the preflight's probes, in their
            # round trip: the stage step's gate and unpacking are skipped.
            early = extravars[hs.STAGE_EARLY_VAR] = hs.stage_early(request.preflight, self.restart, mode, steps)
            skips = (*hs.RUN_SKIPS, *(() if steps else (hs.STAGE_STEPS_TAG,)), *((hs.GATE_TAG, hs.UNPACK_TAG) if early else ()))
            # The run's files go to the nodes that hold them (collect's hosts: every node in sync
            # mode, else the head) while ansible-playbook starts.
            staged_on = extravars["distrun_stage_hosts"] = collect_hosts(cluster, self.limit)
            gate = run.dir / hs.upload_gate(self.restart, attempt)
            extravars[hs.UPLOAD_GATE_VAR] = str(gate)
            upload = Upload(cluster, staged_on, run.id, Path(extravars["distrun_run_bundle"]), extravars["distrun_env_file"],
                            gate, after=self.claim.masters if self.claim is not None else None)
            phases.mark("plan and bundle")
            if project and attempt == 1 and self.restart == 0:
                self.claimed()  # the workdir is written on the run's hosts: they must be the run's
                make_ready(cluster, plan, project, render_env_file(env), run, self.listener)
                phases.mark("workdir sync and prepare")
            title = f"{'preflight, ' if request.preflight else ''}stage, launch {plan.world_size} rank(s) with {plan.launcher}"
            # No fact gathering: the plan was made from the cached facts, and the probe checks the
            # addresses it relies on.
            starter = self.starter = Starter(self.cluster, plan, staged_on, after_steps=steps,
                                             judged=early, attempt=self.attempt)
            result = self.playbook(title, RUN_PLAYBOOK, self.limit, extravars, limit=",".join(self.limit),
                                   cached_facts=True, also=starter.on_event, skip_tags=",".join(skips))
            phases.mark("run.yml (preflight, stage)")
            self.answered(upload)
            # SIGINT or SIGTERM while it ran: the run is interrupted (130) once what the
            # playbook left is cleaned up; ranks it already started are stopped and collected.
            interrupted = result.status == "canceled"
            unstaged = starter.unstaged() if result.ok and early else {}
            if (not result.ok or unstaged) and not (interrupted and starter.started):
                # An upload no stage step took may hold the run's secrets, and what the probes
                # staged belongs to no run that starts: removed, except where the node does not
                # answer (not waited on: the refusal comes first).
                upload.join(5)
                discard(cluster, [h for h in staged_on if not (h in result.hosts and result.hosts[h].unreachable)], run.id,
                        created=starter.made(extravars["distrun_run_dir"], extravars["distrun_checkpoint_dir"] or "") if early else {})
            sshmesh.remember(request.inventory, result.fact(sshmesh.FACT))
            if project:
                record_pulls(run, result)
            self.launched = starter.started or (result.ok and not unstaged)
            if plan.container:  # which image every node had, as its probe found it
                run.write(containers.RECORD, containers.image_record(plan, starter.images))
            if interrupted:
                self.unstaged = not starter.started
                raise KeyboardInterrupt
            if not result.ok:
                self.claimed()
            if unstaged:
                for host, why in unstaged.items():
                    self.listener.node_failed(f"{host}: staging failed: {why}")
                run.finish(4, "staging failed")
                return 4
            if result.ok:
                failed = starter.wait()
                phases.mark("launch")
                if not failed:
                    return None
                for host, why in failed.items():
                    self.listener.node_failed(why if why.startswith(f"{host}: ") else f"{host}: {why}")
                break
            step = hs.failed_step(result)
            if step == "preflight":
                if attempt == 1 and network_changed(from_dicts(result.fact(hs.PREFLIGHT_FACT))):
                    self.listener.replanning()
                    self.preflight(cluster)  # gathers the facts of the run's nodes again
                    self.cluster = load(request)
                    continue
                if attempt == 1 and sshmesh.unverified(result.fact(sshmesh.FACT)):
                    login = True  # a node's ssh setup changed: prove the login again, or refuse on it
                    continue
                self.refuse_preflight(result)
            if step == "stage":
                run.finish(4, "staging failed")
                return 4
            break
        return 5

    def answered(self, upload: Upload) -> None:
        """The claim's and the upload's answers, as states of the attempt, when they came."""
        if self.claim is not None and self.claim.answered_at is not None and not self.claim.refused:
            self.attempt.reach(hs.State.CLAIMED, at=self.claim.answered_at)
        if upload.ended_at is not None and upload.answer == UPLOADED:
            self.attempt.reach(hs.State.UPLOADED, at=upload.ended_at)

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
        if state.state != "running":
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
        failed = outcome.host if outcome.lost else (failed_host(self.end.lines, launcher_named(plan.launcher)) or outcome.host)
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
            run.finish(terminating.exit_code(), terminating.word(), status="stopped")
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
    try:
        cluster = load(request)  # a bad inventory leaves no record
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
            steps, early = _Run(request, listener or Listener(), phases, cluster, claim, early), None
            return steps.execute()
        except UserError as exc:
            if steps is not None:
                steps.cancel_early()  # before its record may be removed
            if claim.refused:  # busy hosts leave no record: nothing ran, nothing was staged
                shutil.rmtree(phases.run.dir, ignore_errors=True)
                raise UserError(f"{exc} (run {run_id} did not start)", exit_code=exc.exit_code) from None
            if phases.run.meta.status == "running":  # the record says why
                phases.run.finish(exc.exit_code, str(exc))
            raise
        except Exception as exc:
            if phases.run.meta.status == "running":
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
    assert plan.partition is not None
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
        if run.meta.status == "running":
            run.finish(1, "interrupted before the partition ended")
    run.finish(0 if result.ok else 1)
    return 0 if result.ok else 1
