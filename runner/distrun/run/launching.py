"""One attempt started: its plan made ready for run.yml (the plan recorded, run.yml's extra-vars,
the upload started), the workdir made ready, run.yml (probes, judge, stage) with the claim's and
the upload's answers going alongside, the launchers started once every node is staged
(starter.py), and what a refused, unstaged or interrupted try left removed. Every step tells the
attempt's state machine (attempt.py), which the record keeps as ``attempts/<n>/states.json``.

A try is made again, as a new try of the same attempt, when the preflight found the nodes'
network changed since the plan (the plan is then made again from the facts gathered anew) or a
node's ssh setup changed (the head then logs in to every node, with the same plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from distrun.errors import ExitCode, UserError
from distrun.planning import containers
from distrun.planning.attempt import AttemptPlan, plan_attempt
from distrun.planning.bundle import needs_stage_steps, record_plan, run_vars
from distrun.planning.request import JobRequest, load
from distrun.planning.run_files import launch_scripts, plan_files, render_env_file
from distrun.preflight import sshmesh
from distrun.preflight.report import from_dicts, network_changed
from distrun.project.ready import Project, commands, load_project, make_ready, pull_command, record_pulls
from distrun.run import certificate
from distrun.run.attempt import Attempt, End
from distrun.run.collect import collect_hosts
from distrun.run.listener import Listener
from distrun.run.pending import Pending
from distrun.run.playbooks import RunPlaybooks
from distrun.run.staging import Upload, discard
from distrun.run.starter import Starter
from distrun.run.stop import interruption
from distrun.store.runs import Phases
from distrun.transport import handshake as hs
from distrun.transport.early_playbook import RUN_PLAYBOOK
from distrun.transport.playbook_events import PlaybookResult


@dataclass
class Ready:
    """One try of an attempt made ready for run.yml: the project, run.yml's extra-vars and skipped
    tags, where the run's files go and their upload (started)."""

    project: Project | None
    extravars: dict
    steps: bool  # the stage step has steps after unpacking
    early: bool  # the probes stage this attempt in their round trip
    skips: tuple[str, ...]
    staged_on: list[str]
    upload: Upload


class Launching:
    """The start of one attempt of a run, from its plan to its launchers."""

    def __init__(self, request: JobRequest, books: RunPlaybooks, phases: Phases, listener: Listener,
                 planned: AttemptPlan, claim: Pending | None = None) -> None:
        self.request, self.books, self.phases, self.listener = request, books, phases, listener
        self.record = phases.run
        self.claim = claim  # None: nothing claimed (a partition alone)
        self.planned = planned
        self.restart = planned.plan.attempt.restart
        self.attempt = self._new_attempt()
        self.starter: Starter | None = None
        self.ready_: Ready | None = None  # the current try's
        self.cleaned = False  # what a refused, unstaged or interrupted try left was removed

    @property
    def plan(self):  # noqa: ANN201 - JobPlan
        return self.planned.plan

    @property
    def hosts(self) -> list[str]:
        """The head and the rank hosts of this attempt."""
        return self.planned.hosts

    @property
    def may_run(self) -> bool:
        """Whether ranks of this attempt may run: its launchers were being started."""
        return self.starter is not None and self.starter.started

    def _new_attempt(self) -> Attempt:
        attempt = Attempt(self.restart)
        if self.claim is not None:
            self.claim.notify(attempt.claim_answered)
        return attempt

    def start(self) -> End:
        """Start the attempt: LAUNCHED once every launcher started, STAGING_FAILED or LAUNCH_FAILED
        (each node's failure told); a refusal is raised (UserError), and so is an interruption
        (KeyboardInterrupt), each once what the try left is removed. The record keeps the states."""
        try:
            return self._start()
        except UserError as refused:
            self.attempt.refused(str(refused), refused.exit_code)
            raise
        except KeyboardInterrupt:
            code, why = interruption(self.record)
            self.attempt.interrupted(why, code)
            if self.ready_ is not None and not self.cleaned and not self.may_run:
                self.discard(self.ready_, {})  # an upload in flight may hold the run's secrets
            raise
        finally:
            self.record.write(f"attempts/{self.restart}/states.json", self.attempt.to_json())

    def _start(self) -> End:
        login = False  # the head logs in to every node even where a login was proved before
        for attempt in (1, 2):
            if attempt == 2:
                self.attempt = self._new_attempt()
            ready = self.ready(attempt, login)
            if ready.project and attempt == 1 and self.restart == 0:
                self.project_ready(ready)
            result = self.run_yml(ready)
            unstaged = self.ran(ready, result)
            if not result.ok:
                self.claimed()
            if unstaged:
                return self.staging_failed(unstaged)
            if result.ok:
                return self.started()
            step = hs.failed_step(result)
            if step == "preflight":
                if attempt == 1 and network_changed(from_dicts(result.fact(hs.PREFLIGHT_FACT))):
                    self.listener.replanning()
                    self.books.gather(self.planned.cluster)  # gathers the facts of the run's nodes again
                    self.replan()
                    continue
                if attempt == 1 and sshmesh.unverified(result.fact(sshmesh.FACT)):
                    login = True  # a node's ssh setup changed: prove the login again, or refuse on it
                    continue
                self.claimed()
                self.record.finish(ExitCode.PREFLIGHT, "preflight failed")
                raise self.books.refusal(result)
            if step == "stage":
                self.attempt.staging_failed("staging failed")
                self.record.finish(ExitCode.STAGING, "staging failed")
                return End.STAGING_FAILED
            break
        self.attempt.launch_failed("run.yml failed")
        return End.LAUNCH_FAILED

    def replan(self) -> None:
        """The plan made again from the facts just gathered (the nodes' network changed)."""
        cluster = load(self.request)
        left_out = frozenset(n.name for n in cluster.workers) - {n.name for n in self.planned.cluster.workers}
        self.planned = plan_attempt(self.request, cluster, self.record.id, restart=self.restart, exclude=left_out)

    def ready(self, attempt: int, login: bool) -> Ready:
        """The plan recorded, run.yml's extra-vars made, the upload of the run's files started."""
        request, record, planned, plan = self.request, self.record, self.planned, self.planned.plan
        cluster = planned.cluster
        files, scripts = plan_files(plan), launch_scripts(plan)
        workdir = request.program.workdir
        project = load_project(workdir, cluster.shared_dir) if workdir else None
        record_plan(record, plan, files, scripts, commands(cluster, plan, project) if project else None)
        extravars = {**run_vars(plan, record, files, scripts, script=request.program.script, env=planned.env,
                                network=planned.network, preflight=request.policy.preflight,
                                workdir_pull=pull_command(cluster, plan, project) if project else None,
                                private=certificate.issue(cluster, plan)),
                     **self.books.preflight_vars(),
                     "preflight_ssh_baseline": {} if login else sshmesh.baseline(request.inventory, cluster.head.name),
                     hs.CLAIM_GATE_VAR: str(record.dir / hs.CLAIM_GATE) if self.claim is not None else ""}
        mode = cluster.shared_fs_mode
        steps = needs_stage_steps(extravars, mode)
        # A first attempt without stage steps is staged by the preflight's probes, in their
        # round trip: the stage step's gate and unpacking are skipped.
        early = extravars[hs.STAGE_EARLY_VAR] = hs.stage_early(request.policy.preflight, self.restart, mode, steps)
        skips = (*hs.RUN_SKIPS, *(() if steps else (hs.STAGE_STEPS_TAG,)), *((hs.GATE_TAG, hs.UNPACK_TAG) if early else ()))
        # The run's files go to the nodes that hold them (collect's hosts: every node in sync
        # mode, else the head) while ansible-playbook starts.
        staged_on = extravars["distrun_stage_hosts"] = collect_hosts(cluster, self.hosts)
        gate = record.dir / hs.upload_gate(self.restart, attempt)
        extravars[hs.UPLOAD_GATE_VAR] = str(gate)
        upload = Upload(cluster, staged_on, record.id, Path(extravars["distrun_run_bundle"]), extravars["distrun_env_file"],
                        gate, after=self.claim.masters if self.claim is not None else None, told=self.attempt.uploaded)
        self.phases.mark("plan and bundle")
        self.ready_ = Ready(project, extravars, steps, early, skips, staged_on, upload)
        return self.ready_

    def project_ready(self, ready: Ready) -> None:
        """A first attempt's --workdir project sent and prepared, once the hosts are claimed."""
        assert ready.project is not None
        self.claimed()  # the workdir is written on the run's hosts: they must be the run's
        make_ready(self.planned.cluster, self.plan, ready.project, render_env_file(self.planned.env), self.record,
                   self.listener)
        self.phases.mark("workdir sync and prepare")

    def run_yml(self, ready: Ready) -> PlaybookResult:
        """run.yml: probed and judged, staged, launched (by the Starter, on the facts it publishes)."""
        plan = self.plan
        ranks = f"{plan.placement.world_size} rank(s) with {plan.launch.launcher}"
        title = f"{'preflight, ' if self.request.policy.preflight else ''}stage, launch {ranks}"
        # No fact gathering: the plan was made from the cached facts, and the probe checks the
        # addresses it relies on.
        starter = self.starter = Starter(self.planned.cluster, plan, ready.staged_on, after_steps=ready.steps,
                                         judged=ready.early, attempt=self.attempt)
        result = self.books.run(title, RUN_PLAYBOOK, self.hosts, ready.extravars, limit=",".join(self.hosts),
                                cached_facts=True, also=starter.on_event, skip_tags=",".join(ready.skips))
        self.phases.mark("run.yml (preflight, stage)")
        return result

    def ran(self, ready: Ready, result: PlaybookResult) -> dict[str, str]:
        """What run.yml left: a refused or unstaged try's upload and staged folders removed, the
        ssh mesh, pulls and image recorded; interrupted (raised) once that is done. Returns the
        nodes the probes did not stage, with why."""
        record, starter, extravars = self.record, self.starter, ready.extravars
        assert starter is not None
        # SIGINT or SIGTERM while it ran: the run is interrupted once what the playbook left is
        # cleaned up; ranks it already started are stopped and collected.
        interrupted = result.status == "canceled"
        unstaged = starter.unstaged() if result.ok and ready.early else {}
        if (not result.ok or unstaged) and not (interrupted and starter.started):
            # What the probes staged belongs to no run that starts: removed, except where the
            # node does not answer (not waited on: the refusal comes first).
            self.discard(ready, {h: r.unreachable for h, r in result.hosts.items()},
                         starter.made(extravars["distrun_run_dir"], extravars["distrun_checkpoint_dir"] or "")
                         if ready.early else {})
        sshmesh.remember(self.request.inventory, result.fact(sshmesh.FACT))
        if ready.project:
            record_pulls(record, result)
        if self.plan.launch.container:  # which image every node had, as its probe found it
            record.write(containers.RECORD, containers.image_record(self.plan, starter.images))
        if interrupted:
            self.cleaned = not starter.started
            raise KeyboardInterrupt
        return unstaged

    def discard(self, ready: Ready, unreachable: dict[str, bool], created: dict[str, list[str]] | None = None) -> None:
        """A try that stages nothing: its upload, which may hold the run's secrets, and the run's
        folders the probes made removed where the node answers."""
        ready.upload.join(5)
        discard(self.planned.cluster, [h for h in ready.staged_on if not unreachable.get(h)], self.record.id,
                created=created or {})

    def claimed(self) -> None:
        """Wait for the claim's answer: busy hosts refuse the run before anything else is said
        about it (a port the other run holds would otherwise fail the preflight first)."""
        if self.claim is not None:
            self.claim.wait()

    def staging_failed(self, unstaged: dict[str, str]) -> End:
        """Staging failed on the nodes the probes could not stage."""
        for host, why in unstaged.items():
            self.listener.node_failed(f"{host}: staging failed: {why}")
        self.attempt.staging_failed("; ".join(f"{h}: {why}" for h, why in unstaged.items()))
        self.record.finish(ExitCode.STAGING, "staging failed")
        return End.STAGING_FAILED

    def started(self) -> End:
        """Launched once every launcher started; else each node's failure told."""
        assert self.starter is not None
        failed = self.starter.wait()
        self.phases.mark("launch")
        if not failed:
            return End.LAUNCHED
        for host, why in failed.items():
            self.listener.node_failed(why if why.startswith(f"{host}: ") else f"{host}: {why}")
        return End.LAUNCH_FAILED
