"""One attempt launched: planned, run.yml started with the claim and the upload going alongside
(the probes, the judge, the stage step), the launchers started once every node is staged, and
the states of handshake.py (``State``) it reached noted in the record. ``Launching`` holds what
the attempts of a run share; train.py's run adds following, restarts and the end to it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from distrun.errors import UserError
from distrun.inventory.cluster import Cluster
from distrun.planning import containers
from distrun.planning.bundle import needs_stage_steps, record_plan, run_vars
from distrun.planning.jobplan import JobPlan
from distrun.planning.request import JobRequest, environment, load, make_plan, network, without
from distrun.planning.run_files import launch_scripts, plan_files, render_env_file
from distrun.preflight import sshmesh
from distrun.preflight.check import preflight_refusal, preflight_vars
from distrun.preflight.report import from_dicts, network_changed
from distrun.project.ready import Project, commands, load_project, make_ready, pull_command, record_pulls
from distrun.run import certificate
from distrun.run.busy import Pending
from distrun.run.collect import collect_hosts
from distrun.run.follow import Starter
from distrun.run.listener import EventHandler, Listener
from distrun.run.staging import UPLOADED, Upload, discard
from distrun.store.runs import Phases
from distrun.transport import handshake as hs
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.early_playbook import RUN_PLAYBOOK, EarlyPlaybook
from distrun.transport.playbook_events import PlaybookEvent, PlaybookResult


@dataclass
class Planned:
    """What planning one try of an attempt made ready for run.yml: the nodes it uses, the plan,
    the project, the ranks' variables, run.yml's extra-vars and skipped tags, where the run's
    files go and their upload (started)."""

    cluster: Cluster
    plan: JobPlan
    project: Project | None
    env: dict[str, str]
    extravars: dict
    steps: bool  # the stage step has steps after unpacking
    early: bool  # the probes stage this attempt in their round trip
    skips: tuple[str, ...]
    staged_on: list[str]
    upload: Upload


class Launching:
    """The steps of an attempt's launch, with what the attempts of a run share: the request, the
    record, the listener, and what the attempts so far did (the plan, the hosts used, restarts)."""

    def __init__(self, request: JobRequest, listener: Listener, phases: Phases, cluster: Cluster,
                 claim: Pending | None = None, early: EarlyPlaybook | None = None) -> None:
        self.request = request
        self.early = early  # run.yml's ansible-playbook, started before the run was planned
        self.claim = claim  # None: nothing claimed (a partition alone)
        self.listener = listener
        self.phases = phases
        self.run = phases.run
        self.cluster = cluster
        self.plan: JobPlan | None = None
        self.limit: list[str] = []  # the head and the rank hosts of the current attempt
        self.used: list[str] = []  # every host an attempt ran on
        self.exclude: frozenset[str] = frozenset()
        self.restart = 0
        self.launched = False  # once every node was staged, ranks may run: stop and collect
        self.unstaged = False  # interrupted before any rank started, what was staged removed: nothing to collect
        self.stopped = False  # the current attempt was stopped already
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
        request, run = self.request, self.run
        login = False  # the head logs in to every node even where a login was proved before
        for attempt in (1, 2):
            planned = self.planned(attempt, login)
            if planned.project and attempt == 1 and self.restart == 0:
                self.project_ready(planned)
            result = self.run_yml(planned)
            unstaged = self.ran(planned, result)
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
                    self.preflight(planned.cluster)  # gathers the facts of the run's nodes again
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

    def planned(self, attempt: int, login: bool) -> Planned:
        """Planned: the plan recorded, run.yml's extra-vars made, the upload of the run's files started."""
        request, run, phases = self.request, self.run, self.phases
        cluster = without(self.cluster, set(self.exclude))
        net = network(cluster)
        plan = make_plan(request, cluster, run.id, net, restart=self.restart)
        files, scripts = plan_files(plan), launch_scripts(plan)
        project = load_project(request.workdir, cluster.shared_dir) if request.workdir else None
        record_plan(run, plan, files, scripts, commands(cluster, plan, project) if project else None)
        self.plan, self.stopped, self.attempt = plan, False, hs.Attempt(self.restart)
        self.limit = list(dict.fromkeys([cluster.head.name, *plan.placement.reached_hosts]))
        self.used = list(dict.fromkeys([*self.used, *self.limit]))
        env = environment(request, cluster)
        extravars = {**run_vars(plan, run, files, scripts, script=request.script, env=env, network=net,
                                preflight=request.preflight,
                                workdir_pull=pull_command(cluster, plan, project) if project else None,
                                private=certificate.issue(cluster, plan)),
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
        return Planned(cluster, plan, project, env, extravars, steps, early, skips, staged_on, upload)

    def project_ready(self, planned: Planned) -> None:
        """A first attempt's --workdir project sent and prepared, once the hosts are claimed."""
        assert planned.project is not None
        self.claimed()  # the workdir is written on the run's hosts: they must be the run's
        make_ready(planned.cluster, planned.plan, planned.project, render_env_file(planned.env), self.run, self.listener)
        self.phases.mark("workdir sync and prepare")

    def run_yml(self, planned: Planned) -> PlaybookResult:
        """run.yml: probed and judged, staged, launched (by the Starter, on the facts it publishes);
        the claim's and the upload's answers noted when it returned."""
        plan = planned.plan
        ranks = f"{plan.placement.world_size} rank(s) with {plan.launch.launcher}"
        title = f"{'preflight, ' if self.request.preflight else ''}stage, launch {ranks}"
        # No fact gathering: the plan was made from the cached facts, and the probe checks the
        # addresses it relies on.
        starter = self.starter = Starter(self.cluster, plan, planned.staged_on, after_steps=planned.steps,
                                         judged=planned.early, attempt=self.attempt)
        result = self.playbook(title, RUN_PLAYBOOK, self.limit, planned.extravars, limit=",".join(self.limit),
                               cached_facts=True, also=starter.on_event, skip_tags=",".join(planned.skips))
        self.phases.mark("run.yml (preflight, stage)")
        self.answered(planned.upload)
        return result

    def ran(self, planned: Planned, result: PlaybookResult) -> dict[str, str]:
        """What run.yml left: a refused or unstaged try's upload and staged folders removed, the
        ssh mesh, pulls and image recorded; interrupted (raised) once that is done. Returns the
        nodes the probes did not stage, with why."""
        run, starter, extravars = self.run, self.starter, planned.extravars
        assert starter is not None
        # SIGINT or SIGTERM while it ran: the run is interrupted (130) once what the
        # playbook left is cleaned up; ranks it already started are stopped and collected.
        interrupted = result.status == "canceled"
        unstaged = starter.unstaged() if result.ok and planned.early else {}
        if (not result.ok or unstaged) and not (interrupted and starter.started):
            # An upload no stage step took may hold the run's secrets, and what the probes
            # staged belongs to no run that starts: removed, except where the node does not
            # answer (not waited on: the refusal comes first).
            planned.upload.join(5)
            discard(planned.cluster, [h for h in planned.staged_on if not (h in result.hosts and result.hosts[h].unreachable)],
                    run.id, created=starter.made(extravars["distrun_run_dir"], extravars["distrun_checkpoint_dir"] or "")
                    if planned.early else {})
        sshmesh.remember(self.request.inventory, result.fact(sshmesh.FACT))
        if planned.project:
            record_pulls(run, result)
        self.launched = starter.started or (result.ok and not unstaged)
        if planned.plan.launch.container:  # which image every node had, as its probe found it
            run.write(containers.RECORD, containers.image_record(planned.plan, starter.images))
        if interrupted:
            self.unstaged = not starter.started
            raise KeyboardInterrupt
        return unstaged

    def staging_failed(self, unstaged: dict[str, str]) -> int:
        """Staging failed on the nodes the probes could not stage: 4."""
        for host, why in unstaged.items():
            self.listener.node_failed(f"{host}: staging failed: {why}")
        self.run.finish(4, "staging failed")
        return 4

    def started(self) -> int | None:
        """Launched: None once every launcher started, else each node's failure told and 5."""
        assert self.starter is not None
        failed = self.starter.wait()
        self.phases.mark("launch")
        if not failed:
            return None
        for host, why in failed.items():
            self.listener.node_failed(why if why.startswith(f"{host}: ") else f"{host}: {why}")
        return 5

    def answered(self, upload: Upload) -> None:
        """The claim's and the upload's answers, as states of the attempt, when they came."""
        if self.claim is not None and self.claim.answered_at is not None and not self.claim.refused:
            self.attempt.reach(hs.State.CLAIMED, at=self.claim.answered_at)
        if upload.ended_at is not None and upload.answer == UPLOADED:
            self.attempt.reach(hs.State.UPLOADED, at=upload.ended_at)
