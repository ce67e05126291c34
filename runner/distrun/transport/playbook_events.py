"""What a playbook run tells: ansible-runner's events read as each host's progress (its tasks'
counts, the facts its steps publish, the step it failed in, the line that says why) and the
playbook's result; a ``PlaybookEvent`` per event for whoever shows them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distrun.transport.handshake import STEP_FACT


@dataclass
class HostProgress:
    name: str
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    last_error: str = ""
    # What the playbook published about this host: the public facts its tasks set (set_fact).
    facts: dict[str, Any] = field(default_factory=dict)
    # The step the host failed in: the last distrun_step the play published before (its hosts go
    # through the tasks together, so a step is the play's, and a run_once task may publish it).
    # A playbook's steps say so themselves; the runner never reads a play's or a task's name.
    failed_step: str = ""
    # The seconds a task of this host was given before Ansible stopped it (its ``timeout:``): the
    # node hung there (a process in a hung filesystem, a stopped sshd session). 0: none did.
    hung_s: int = 0

    @property
    def state(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "ok"


@dataclass
class PlaybookEvent:
    kind: str  # "play", "task", "ok", "changed", "failed", "unreachable", "skipped", "stats"
    host: str | None
    task: str
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class PlaybookResult:
    playbook: str
    rc: int
    status: str
    hosts: dict[str, HostProgress]
    artifact_dir: Path

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.status == "successful"

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    def failures(self) -> list[HostProgress]:
        return [h for h in self.hosts.values() if h.failed or h.unreachable]

    def fact(self, name: str) -> Any:
        """A fact the playbook published (a run_once one arrives with one host), or None."""
        return next((h.facts[name] for h in self.hosts.values() if name in h.facts), None)


def _message(res: Mapping[str, Any]) -> str:
    """The most useful line of a failed task: what the command said beats Ansible's summary.

    "non-zero return code" and a loop's "One or more items failed" name no cause; the failing
    item's stderr (ssh's "Connection timed out", a Python traceback's last line) does.
    """
    for item in res.get("results") or []:
        if isinstance(item, Mapping) and item.get("failed"):
            inner = _message(item)
            label = item.get("item")
            if inner:
                return f"{label}: {inner}" if isinstance(label, str) else inner
    for key in ("stderr", "module_stderr", "msg", "stdout"):
        value = res.get(key)
        if not value:
            continue
        lines = [ln.strip() for ln in str(value).strip().splitlines() if ln.strip()]
        if lines:
            return lines[-1][:400] if key != "msg" else " ".join(lines)[:400]
    return ""


class EventReader:
    """Turns ansible-runner's events into host progress and PlaybookEvents for ``on_event``;
    keeps the facts each host's tasks publish (set_fact) and the step it failed in."""

    def __init__(self, on_event: Callable[[PlaybookEvent], None] | None = None) -> None:
        self.on_event = on_event
        self.hosts: dict[str, HostProgress] = {}
        self.task = ""
        self.step = ""  # the last distrun_step any host published

    def host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress(name))

    def emit(self, ev: PlaybookEvent) -> None:
        if self.on_event is not None:
            self.on_event(ev)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        name = data.get("host")
        task = str(data.get("task") or self.task)
        res = data.get("res") or {}
        if kind == "playbook_on_play_start":
            self.emit(PlaybookEvent("play", None, str(data.get("play", ""))))
        elif kind == "playbook_on_task_start":
            self.task = task
            self.emit(PlaybookEvent("task", None, task))
        elif kind == "runner_on_start" and name:
            self.host(name).task = task
            self.emit(PlaybookEvent("start", name, task))
        elif kind == "runner_on_ok" and name:
            h = self.host(name)
            h.ok += 1
            changed = bool(res.get("changed"))
            h.changed += int(changed)
            facts = res.get("ansible_facts")
            if str(data.get("task_action", "")).endswith("set_fact") and isinstance(facts, Mapping):
                # What a step publishes: the public facts it sets (a leading _ marks a role's own).
                h.facts.update({k: v for k, v in facts.items() if not str(k).startswith("_")})
                self.step = str(facts.get(STEP_FACT, self.step))
            self.emit(PlaybookEvent("changed" if changed else "ok", name, task, data=res))
        elif kind == "runner_on_failed" and name and not data.get("ignore_errors"):
            h = self.host(name)
            h.failed += 1
            facts = res.get("ansible_facts")
            if str(data.get("task_action", "")).endswith("set_fact") and isinstance(facts, Mapping):
                # A task that publishes and fails its node (the preflight's judge): what it published counts.
                h.facts.update({k: v for k, v in facts.items() if not str(k).startswith("_") and k != STEP_FACT})
            h.last_error = f"{task}: {_message(res)}"
            h.failed_step = h.failed_step or self.step
            timed = res.get("timedout")
            if isinstance(timed, Mapping) and isinstance(timed.get("period"), int):
                h.hung_s = timed["period"]
            self.emit(PlaybookEvent("failed", name, task, _message(res), res))
        elif kind == "runner_on_unreachable" and name:
            h = self.host(name)
            h.unreachable = True
            h.last_error = f"{task}: {_message(res)}"
            h.failed_step = h.failed_step or self.step
            self.emit(PlaybookEvent("unreachable", name, task, _message(res), res))
        elif kind == "runner_on_skipped" and name:
            self.host(name).skipped += 1
            self.emit(PlaybookEvent("skipped", name, task))
        elif kind == "playbook_on_stats":
            self.emit(PlaybookEvent("stats", None, "", data=data))
        return True
