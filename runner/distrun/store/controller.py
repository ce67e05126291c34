"""The distrun process that follows a run (its controller): who it is, and whether it still lives.

A run record says "running" because a controller wrote it; the record is only as true as that
controller is alive. The record keeps the controller's host, pid, the pid's start time and the
machine's boot id, so a pid reused after the controller died, or after a reboot, is not taken
for it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When pid started, in clock ticks since boot (field 22 of /proc/PID/stat); None where
    there is no /proc (macOS) or no such process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        # The command name in parentheses may hold spaces: count the fields after its ')'.
        return int(text.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    text = _read(_BOOT_ID)
    return text.strip() if text else None


def identity(pid: int | None = None) -> dict[str, Any]:
    """This process (or pid) as a record keeps it."""
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid), "boot": boot_id()}


def alive(controller: Any) -> bool | None:
    """Whether the controller a record names still runs: True, False, or None when it ran on
    another machine (only that machine could tell)."""
    if not isinstance(controller, dict) or not isinstance(controller.get("pid"), int):
        return False
    if controller.get("host") != socket.gethostname():
        return None
    if controller.get("boot") and boot_id() and controller["boot"] != boot_id():
        return False  # this machine rebooted since: the controller died with it
    pid = int(controller["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user holds the pid: its start time tells
    stat = _read(f"/proc/{pid}/stat")
    if stat is not None and stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
        return False  # it exited; only its parent has not read its status yet
    start = controller.get("start")
    return start is None or process_start(pid) == start


def terminate(controller: Any) -> bool:
    """SIGTERM to the controller a record names, only while it is that process (alive() checks
    the pid's start time): the controller takes it as Ctrl-C. True when it was sent."""
    if alive(controller) is not True or controller.get("pid") == os.getpid():
        return False  # never this process itself
    try:
        os.kill(int(controller["pid"]), signal.SIGTERM)
    except OSError:
        return False
    return True


def wait_gone(controller: Any, timeout_s: float) -> bool:
    """Wait until the controller no longer runs (at most timeout_s); whether it is gone."""
    deadline = time.monotonic() + timeout_s
    while alive(controller) is True:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def describe(controller: Any) -> str:
    """'pid 4242 on laptop' for messages."""
    if not isinstance(controller, dict):
        return "no distrun process"
    return f"pid {controller.get('pid')} on {controller.get('host')}"
