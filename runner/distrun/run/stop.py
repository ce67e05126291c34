"""'distrun stop': every process of a train run on every node, with a count per node. A run that
a distrun process still starts or follows (its controller) is stopped by that process first, as
Ctrl-C would, wherever its start is (planned, probed, staged, launching) or while it follows the
ranks: asked in the record, then signalled; it records the run as stopped by 'distrun stop'."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from distrun import terminating
from distrun.errors import ExitCode, UserError
from distrun.launchers import launcher_named
from distrun.planning import containers
from distrun.planning.jobplan import JobPlan
from distrun.printable import printable
from distrun.store import controller
from distrun.store.runs import RecordError, Run, RunStatus, load_run
from distrun.transport import nodeprog
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.playbook_events import PlaybookEvent, PlaybookResult


@dataclass
class StopReport:
    """What 'distrun stop' did on each node: processes stopped, or why the node was missed."""

    run_id: str = ""
    stopped: dict[str, int] = field(default_factory=dict)
    missed: dict[str, str] = field(default_factory=dict)
    followed_by: str = ""  # the distrun process that started or followed the run and stopped it first
    unreachable: set[str] = field(default_factory=set)

    @property
    def rc(self) -> int:
        return 1 if self.missed else 0

    def refusal(self) -> UserError:
        """The error that ends a stop that missed nodes."""
        return UserError(f"run {self.run_id}: could not stop it on {', '.join(self.missed)}; "
                         "its processes there may still run: bring the node back and run 'distrun stop' again",
                         exit_code=ExitCode.FAILED)


def survivors(answer: dict) -> str:
    """What the node program's stop says outlived its KILL, or "" when nothing did."""
    left = [p for p in answer.get("survived") or [] if isinstance(p, dict)]
    if not left:
        return ""
    named = ", ".join(f"{p['pid'] if isinstance(p.get('pid'), int) else '?'} ({printable(str(p.get('comm', '?')))[:32]})"
                      for p in left[:5])
    return f"{len(left)} process(es) of the run outlived SIGKILL: {named}"


def stop_report(result: PlaybookResult, outputs: dict[str, str], run_id: str = "") -> StopReport:
    """Per node: the count the stop step answered (``outputs``: host -> its stdout, the node
    program's one JSON line), or the error of a node that failed, could not be reached or kept
    processes of the run alive."""
    report = StopReport(run_id)
    for name in sorted(set(result.hosts) | set(outputs)):
        h = result.hosts.get(name)
        got = nodeprog.answer(outputs.get(name, ""), "stop")
        if h is not None and h.hung_s:
            report.missed[name] = (f"hung: its stop step did not end within {h.hung_s} s (a process of the run "
                                   "waits where no signal reaches it, in a shared folder that stopped answering, say)")
        elif h is not None and (h.unreachable or h.failed):
            report.missed[name] = ("unreachable: " if h.unreachable else "") + (h.last_error or "failed")
        elif got is None or not isinstance(got.get("stopped"), int):
            report.missed[name] = "no report from the stop step"
        elif survivors(got):
            report.missed[name] = survivors(got)
        else:
            report.stopped[name] = got["stopped"]
    return report


def stop_vars(run_id: str, plan: JobPlan | None) -> dict[str, object]:
    """The extra-vars of playbooks/stop.yml for a run: its id, the launcher's own cancel
    (Launcher.cancel) and, for a run with an image, the removal of its containers by label."""
    extravars: dict[str, object] = {"distrun_run_id": run_id}
    if plan is not None:
        extravars.update(launcher_named(plan.launch.launcher).cancel(plan))
        if argv := containers.stop_argv(plan):
            extravars["distrun_container_stop_argv"] = argv
    return extravars


def recorded(run: Run) -> JobPlan | None:
    """The run's plan as its record keeps it, or None for a record that never had one."""
    from distrun.run.liveness import recorded_plan

    try:
        return recorded_plan(run)
    except RecordError:
        return None


STOPPED = "stopped by 'distrun stop'"
# In the record: how many processes the run's own stops stopped on each node (the controller's,
# which 'distrun stop' adds to its own count).
STOPPED_FILE = "stopped.json"
# How long 'distrun stop' waits for the run's controller to stop it (stop its ranks, collect).
CONTROLLER_WAIT_S = 120


def stop_controller(run: Run) -> str:
    """Have the run's controller, where it runs on this machine, stop the run itself: the request
    in the record, then SIGTERM, and wait for it to end. Which process it was, or "" when none
    here follows the run."""
    if run.meta.status != RunStatus.RUNNING or controller.alive(run.meta.controller) is not True \
            or run.meta.controller == controller.identity():  # a record this very process made
        return ""
    who = controller.describe(run.meta.controller)
    run.ask_to_stop()
    if controller.terminate(run.meta.controller):
        controller.wait_gone(run.meta.controller, CONTROLLER_WAIT_S)
    run.reload()
    return who


def interruption(record: Run) -> tuple[int, str]:
    """The exit code and words of a run its controller stopped when interrupted: asked by 'distrun
    stop' (130), Ctrl-C (130), or a signal in its own terminal (143)."""
    if record.stop_asked:
        return ExitCode.INTERRUPTED, STOPPED
    return terminating.exit_code(), terminating.word()


def stop_play(record: Run, inventory: Path, plan: JobPlan | None, hosts: list[str] | None = None) -> StopReport:
    """playbooks/stop.yml for the record's run on hosts (default: every node of the inventory):
    the launcher's cancel, then every process of the run; what it stopped on each node, kept in
    the record (STOPPED_FILE, added to what earlier stops of the run stopped)."""
    outputs: dict[str, str] = {}

    def on_event(ev: PlaybookEvent) -> None:
        out = str((ev.data or {}).get("stdout") or "") if ev.host else ""
        if ev.host and nodeprog.answer(out, "stop") is not None:
            outputs[ev.host] = out

    extravars = stop_vars(record.id, plan)
    if hosts:
        result = run_playbook("playbooks/stop.yml", inventory, record.dir, extravars=extravars, on_event=on_event,
                              limit=",".join(hosts))
    else:
        result = run_playbook("playbooks/stop.yml", inventory, record.dir, extravars=extravars, on_event=on_event)
    report = stop_report(result, outputs, record.id)
    report.unreachable = {h.name for h in result.hosts.values() if h.unreachable}
    kept = stopped_before(record)
    for host, n in report.stopped.items():
        kept[host] = kept.get(host, 0) + n
    record.write(STOPPED_FILE, json.dumps(kept, indent=2, sort_keys=True) + "\n")
    return report


def stopped_before(record: Run) -> dict[str, int]:
    """How many processes the run's own stops stopped on each node, as its record keeps it."""
    try:
        kept = json.loads((record.dir / STOPPED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(h): n for h, n in kept.items() if isinstance(n, int)} if isinstance(kept, dict) else {}


def stop_run(run_id: str) -> StopReport:
    """Stop a train run everywhere and mark its record stopped; what was stopped where (counting
    what its controller stopped, where it stopped the run first)."""
    run: Run = load_run(run_id, verb="train")
    if run.meta.verb != "train":
        raise UserError(f"run {run.id} is a '{run.meta.verb}' run: only train runs have processes to stop")
    followed_by = stop_controller(run)
    by_controller = stopped_before(run) if followed_by else {}
    report = stop_play(run, Path(run.meta.inventory), recorded(run))
    for host in report.stopped:
        report.stopped[host] += by_controller.get(host, 0)
    report.followed_by = followed_by
    if run.meta.status == RunStatus.RUNNING:
        if report.missed:
            run.finish(ExitCode.INTERRUPTED, f"stop incomplete: {', '.join(report.missed)} not reached",
                       status=RunStatus.STOPPED)
        else:
            run.finish(ExitCode.INTERRUPTED, STOPPED, status=RunStatus.STOPPED)
    return report
