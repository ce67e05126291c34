"""One training run, end to end: plan, preflight, stage and launch in one playbook, follow the
ranks, stop and collect, summarise. Prints nothing: it reports through a ``Listener``, which
the UI implements (``ui_run.TrainView``); a bare Listener runs silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict

from .ansible_bridge import PlaybookEvent, PlaybookResult, run_playbook
from .bundle import common_vars, launch_scripts, plan_files, record_plan, render_env_file, run_vars, stage_vars
from .check import PREFLIGHT_FACT, preflight_vars, report_of
from .collect import CAPPED, FINAL, REFUSED, UNREACHABLE, collect_hosts, pull_run
from .diagnosis import RunSummary, summarise
from .errors import UserError
from .follow import Outcome, follow
from .inventory import Cluster
from .judge import refusal
from .launchers import launcher_named
from .plan import JobPlan
from .planning import JobRequest, environment, facts_unusable, load, make_plan, network
from .project import commands, load_project, make_ready, pull_command, record_pulls
from .runs import Phases, Run, new_run
from .workdir import Scan, SyncStats

EventHandler = Callable[[PlaybookEvent], None]
# The steps of run.yml, in order; each play publishes its own as the fact distrun_step.
STEPS = ("preflight", "stage", "launch")


class Listener:
    """What a run reports as it goes. Every method does nothing here; the UI overrides them."""

    def started(self, run: Run) -> None:
        """The run record exists."""

    def playbook(self, title: str, hosts: list[str]) -> AbstractContextManager[EventHandler | None]:
        """A playbook is about to run on hosts: the context is open while it runs and gives its event handler."""
        return contextlib.nullcontext(None)

    def playbook_failed(self, result: PlaybookResult, elapsed: float) -> None:
        """A playbook failed in a way no later message explains."""

    def replanning(self) -> None:
        """The nodes' network changed since the plan was made: planning again."""

    def line(self, text: str) -> None:
        """One line of the head launcher's output, as it comes."""

    def workdir_synced(self, host: str, scan: Scan, stats: SyncStats) -> None:
        """--workdir: the project folder reached the head; what rsync sent."""

    def prepare_started(self, host: str, argv: tuple[str, ...]) -> None:
        """--prepare starts on the head."""

    def prepare_line(self, text: str) -> None:
        """One line of --prepare's output, as it comes."""

    def node_failed(self, reason: str) -> None:
        """A node ended the run (its launcher failed, or the node was lost): every rank is being stopped."""

    def interrupted(self) -> None:
        """Ctrl-C: every rank is being stopped."""

    def warn(self, message: str) -> None:
        """Something went wrong that does not change the run's result (logs not collected)."""

    def finished(self, summary: RunSummary) -> None:
        """The run ended and its record is complete."""


def collect_limits() -> dict[str, int]:
    """Bytes and seconds one node's collect may take: DISTRUN_COLLECT_MAX_MB and
    DISTRUN_COLLECT_TIMEOUT_S on the controller, else the defaults."""
    limits: dict[str, int] = {}
    for var, key, scale in (("DISTRUN_COLLECT_MAX_MB", "max_bytes", 1 << 20), ("DISTRUN_COLLECT_TIMEOUT_S", "timeout_s", 1)):
        text = os.environ.get(var)
        if text:
            if not text.isdigit() or int(text) == 0:
                raise UserError(f"{var}={text!r}: give a positive whole number")
            limits[key] = int(text) * scale
    return limits


class _Run:
    """The steps of one run, with what they share: the request, the record, the listener."""

    def __init__(self, request: JobRequest, listener: Listener, phases: Phases) -> None:
        self.request = request
        self.listener = listener
        self.phases = phases
        self.run = phases.run

    def playbook(self, title: str, playbook: str, hosts: list[str], extravars: dict,
                 limit: str | None = None) -> PlaybookResult:
        """Run a playbook with progress."""
        started = time.monotonic()
        with self.listener.playbook(title, hosts) as on_event:
            result = run_playbook(playbook, self.request.inventory, self.run.dir, extravars=extravars,
                                  on_event=on_event, limit=limit)
        # A failed preflight is told in one line by the same judge as 'distrun check' (refuse_preflight).
        if not result.ok and not (result.fact(PREFLIGHT_FACT) is not None and failed_step(result) == "preflight"):
            self.listener.playbook_failed(result, time.monotonic() - started)
        return result

    def preflight_vars(self) -> dict:
        return {"preflight_ports": [self.request.port], **preflight_vars(str(self.request.inventory), self.run.dir)}

    def preflight(self, cluster: Cluster) -> None:
        names = [n.name for n in cluster.nodes]  # --hosts/--exclude: only the run's nodes
        result = self.playbook("preflight", "playbooks/preflight.yml", names, self.preflight_vars(), limit=",".join(names))
        if not result.ok:
            self.refuse_preflight(result)

    def refuse_preflight(self, result: PlaybookResult) -> None:
        self.run.finish(3, "preflight failed")
        raise UserError(preflight_refusal(result, str(self.request.inventory)), exit_code=3)

    def stop(self, plan: JobPlan, limit: str | None) -> None:
        run_playbook("playbooks/stop.yml", self.request.inventory, self.run.dir,
                     extravars={"distrun_run_id": plan.run_id}, limit=limit)

    def collect(self, plan: JobPlan, cluster: Cluster, lost: str | None = None) -> None:
        dest = self.run.dir / "nodes"
        dest.mkdir(exist_ok=True, mode=0o700)
        hosts = [h for h in collect_hosts(cluster, [h.name for h in plan.hosts]) if h != lost]
        failed = pull_run(cluster, plan.run_dir, hosts, dest, **collect_limits())
        for h, e in failed.items():
            if e.startswith((REFUSED, CAPPED)):
                what = "refused" if e.startswith(REFUSED) else "incomplete"
                self.listener.warn(f"collect from {h} {what}: {e.split(': ', 1)[1]}")
        unreachable = {h: e for h, e in failed.items() if e.startswith(UNREACHABLE)}
        retry = [h for h in failed if not failed[h].startswith(FINAL)]
        lost_msgs = [f"{h} ({e[len(UNREACHABLE):]})" for h, e in unreachable.items()]
        if lost:
            lost_msgs.insert(0, f"{lost} (lost during the run)")
        if retry:
            # Whatever a tar over ssh could not bring from a reachable node, the playbook tries file by file.
            result = run_playbook("playbooks/collect.yml", self.request.inventory, self.run.dir,
                                  extravars={**common_vars(plan), "distrun_collect_dest": str(dest)}, limit=",".join(retry))
            lost_msgs += [f"{h.name} ({h.last_error})" for h in result.failures()]
        if lost_msgs:
            self.listener.warn(f"logs not collected from: {', '.join(lost_msgs)}")

    def follow(self, cluster: Cluster, plan: JobPlan, scripts: dict[str, str], lines: list[str]) -> Outcome:
        with (self.run.dir / "launcher.log").open("w") as log:

            def on_line(text: str) -> None:
                log.write(text + "\n")
                log.flush()
                lines.append(text)
                if len(lines) > 4000:
                    del lines[:2000]
                self.listener.line(text)

            return follow(cluster, plan, list(scripts), on_line)

    def execute(self, cluster: Cluster) -> int:
        request, run, phases, listener = self.request, self.run, self.phases, self.listener
        listener.started(run)
        phases.mark("load inventory")
        if request.preflight and facts_unusable(cluster):
            # First run against these nodes: the plan needs their interfaces and GPUs, so gather
            # facts first; later runs plan from the cache and run.yml verifies it still holds.
            self.preflight(cluster)
            cluster = load(request)
            phases.mark("gather facts (first run)")
        started = time.monotonic()
        rc: int | None = None
        interrupted = False
        lines: list[str] = []
        plan: JobPlan | None = None
        limit = ""
        launched = False  # once run.yml reached its launch play, ranks may run: stop and collect
        lost: str | None = None  # a node the run lost: not waited on again when stopping and collecting
        try:
            for attempt in (1, 2):
                net = network(cluster)
                plan = make_plan(request, cluster, run.id, net)
                files = plan_files(plan)
                scripts = launch_scripts(plan)
                project = load_project(request.workdir, cluster.shared_dir) if request.workdir else None
                record_plan(run, plan, files, scripts, commands(cluster, plan, project) if project else None)
                limit = ",".join(dict.fromkeys([cluster.head.name, *(h.name for h in plan.hosts)]))
                env = environment(request, cluster)
                extravars = {**run_vars(plan, run, files, scripts, script=request.script, env=env, network=net,
                                        preflight=request.preflight,
                                        workdir_pull=pull_command(cluster, plan, project) if project else None),
                             **self.preflight_vars()}
                phases.mark("plan and bundle")
                if project and attempt == 1:
                    make_ready(cluster, plan, project, render_env_file(env), run, listener)
                    phases.mark("workdir sync and prepare")
                started = time.monotonic()
                title = f"{'preflight, ' if request.preflight else ''}stage, launch {plan.world_size} rank(s) with {plan.launcher}"
                result = self.playbook(title, "playbooks/run.yml", limit.split(","), extravars, limit=limit)
                phases.mark("run.yml (preflight, stage, launch)")
                if project:
                    record_pulls(run, result)
                step = "launch" if result.ok else failed_step(result)
                launched = step == "launch"
                if result.ok:
                    break
                if step == "preflight":
                    replan = any(h.facts.get("distrun_network_changed") for h in result.failures())
                    if replan and attempt == 1:
                        listener.replanning()
                        cluster = load(request)  # facts now fresh
                        continue
                    self.refuse_preflight(result)
                if step == "stage":
                    run.finish(4, "staging failed")
                    return 4
                rc = 5
                break
            assert plan is not None
            if rc is None:
                outcome = self.follow(cluster, plan, scripts, lines)
                rc = outcome.rc
                phases.mark("follow (ranks run)")
                if outcome.lost:
                    lost = outcome.host
                if outcome.host and outcome.rc != 0:
                    listener.node_failed(outcome.reason)
                    lines.append(f"DISTRUN_FAILED_HOST {outcome.host} {outcome.reason}")
        except KeyboardInterrupt:
            interrupted = True
            listener.interrupted()
        finally:
            if plan is not None and limit and (launched or interrupted):
                if interrupted or rc is None or rc != 0:
                    # A lost node is left out: Ansible would wait its connect timeout for it, and its
                    # ranks lose their peers and the head's orted with it.
                    self.stop(plan, ",".join(h for h in limit.split(",") if h != lost))
                    phases.mark("stop")
                self.collect(plan, cluster, lost)
                phases.mark("collect")
        elapsed = time.monotonic() - started
        if interrupted:
            run.finish(130, "interrupted", status="stopped")
            return 130
        assert rc is not None and plan is not None
        summary = summarise(run.id, rc, elapsed, lines, launcher_named(plan.launcher), plan.world_size, run.dir / "nodes")
        if summary.result is not None:
            run.write("result.json", json.dumps(summary.result, indent=2) + "\n")
        run.finish(summary.exit_code, summary.text)
        listener.finished(summary)
        phases.mark("summary")
        return summary.exit_code


def failed_step(result: PlaybookResult) -> str:
    """The earliest step of run.yml a host failed in, as the hosts' distrun_step said: 'preflight',
    'stage' or 'launch' (a host that failed before any step said so: 'preflight')."""
    steps = {h.failed_step or STEPS[0] for h in result.failures()}
    return next((step for step in STEPS if step in steps), STEPS[-1])


def preflight_refusal(result: PlaybookResult, inventory: str) -> str:
    """The one line that refuses a run: what 'distrun check' says about the same fault (the role's
    verdict, and the nodes that did not answer), every failing node named."""
    report = report_of(result, list(result.hosts))
    line = refusal(report)
    bad = sorted({h for items in report.values() for h, it in items.items() if not it.ok})
    if not line:
        bad = [h.name for h in result.failures()]
        line = "; ".join(f"{h.name}: {h.last_error}" for h in result.failures()) or "a node failed the preflight"
    return (f"preflight failed on {', '.join(bad) or 'the cluster'}: {line}; nothing was started "
            f"(see 'distrun check --inventory {inventory}')")


def run_job(request: JobRequest, listener: Listener | None = None) -> int:
    """Run a training job to its end; distrun's exit code."""
    t0 = time.monotonic()
    cluster = load(request)  # a bad inventory leaves no record
    launcher_named(request.launcher).require_ready(cluster)
    collect_limits()  # a bad limit is refused before anything starts
    phases = Phases(new_run("train", request.inventory), t0)
    try:
        return _Run(request, listener or Listener(), phases).execute(cluster)
    except UserError as exc:
        if phases.run.meta.status == "running":  # e.g. a plan error: the record says why
            phases.run.finish(exc.exit_code, str(exc))
        raise
    except Exception as exc:
        if phases.run.meta.status == "running":
            phases.run.finish(1, f"internal error: {type(exc).__name__}: {exc}")
        raise
    finally:
        phases.save()


def run_partition_only(request: JobRequest, listener: Listener | None = None) -> int:
    """Partition the graph on the head node for the request's world size; 0 or 1."""
    cluster = load(request)
    run = new_run("partition", request.inventory)
    plan = make_plan(JobRequest(**{**asdict(request), "workload": "gcn", "script": None}), cluster, run.id, network(cluster))
    assert plan.partition is not None
    steps = _Run(request, listener or Listener(), Phases(run))
    result = steps.playbook("partition", "playbooks/stage.yml", [cluster.head.name],
                            stage_vars(plan, run, {}, {}, None, jittor_warm=False), limit=cluster.head.name)
    run.finish(0 if result.ok else 1)
    return 0 if result.ok else 1
