"""A benchmark's Ansible callback: the controller's CPU per task of a play, and how many hosts ran it.

Enabled by bench/slope.py (``--profile``) through ANSIBLE_CALLBACK_PLUGINS and
ANSIBLE_CALLBACKS_ENABLED; it writes one JSON line per task to the file DISTRUN_CPU_TASKS names.
ansible-playbook's own CPU (``self_s``: the strategy, templating, results, callbacks) and its
reaped workers' with everything they waited for (``workers_s``: the fork per host and task, the
module's build, the ssh client) are read at each task's start; a task's figures are the differences
to the next one's start. A benchmark's tool: it changes nothing in a play.
"""

from __future__ import annotations

import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase


def _now() -> tuple[float, float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime, time.monotonic()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "cpu_tasks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._out = os.environ.get("DISTRUN_CPU_TASKS", "")
        self._task: str | None = None
        self._hosts: dict[str, int] = {}
        self._start = _now()
        self._begin = self._start

    def _close(self) -> None:
        if self._task is None or not self._out:
            return
        now = _now()
        row = {"task": self._task, "hosts": self._hosts, "self_s": round(now[0] - self._start[0], 3),
               "workers_s": round(now[1] - self._start[1], 3), "wall_s": round(now[2] - self._start[2], 3)}
        with open(self._out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self._task = None

    def _open(self, name: str) -> None:
        self._close()
        self._task, self._hosts, self._start = name, {}, _now()

    def v2_playbook_on_start(self, playbook) -> None:  # noqa: ANN001
        self._open("(start: parse, inventory, play)")

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:  # noqa: ANN001
        self._open(task.get_name())

    def v2_playbook_on_handler_task_start(self, task) -> None:  # noqa: ANN001
        self._open(task.get_name())

    def _count(self, kind: str) -> None:
        self._hosts[kind] = self._hosts.get(kind, 0) + 1

    def v2_runner_on_ok(self, result) -> None:  # noqa: ANN001
        self._count("ok")

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:  # noqa: ANN001
        self._count("failed")

    def v2_runner_on_skipped(self, result) -> None:  # noqa: ANN001
        self._count("skipped")

    def v2_runner_on_unreachable(self, result) -> None:  # noqa: ANN001
        self._count("unreachable")

    def v2_playbook_on_stats(self, stats) -> None:  # noqa: ANN001
        self._open("(end: stats)")
        self._close()
