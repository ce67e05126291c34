"""SIGTERM and SIGHUP end distrun as Ctrl-C does. Whatever the verb is doing when one arrives,
it goes the Ctrl-C way (a followed run: every rank stopped, logs collected, the record closed
as stopped), then exits 143 instead of 130, so that 'timeout', a batch system or a closed
terminal never leaves ranks running with nothing following them.

SIGHUP (the terminal closed) does the same, after pointing the output at /dev/null (nothing
can be written to a terminal that is gone). A SIGHUP that was ignored when distrun started
('nohup distrun train ...') stays ignored: the run goes on. For a run that must outlive the
terminal, 'distrun train --detach' (then 'distrun attach') is the way.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from distrun.errors import ExitCode

received: int | None = None  # the signal that ended the command, once one did


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, taken as Ctrl-C is (every 'except KeyboardInterrupt' handles it)."""


def note(signum: int) -> None:
    """A handler of another module that caught a signal itself (a playbook's) says which; after
    SIGHUP the output goes to /dev/null (nothing can be written to a terminal that is gone)."""
    global received
    if signum in (signal.SIGTERM, signal.SIGHUP):
        received = signum
    if signum == signal.SIGHUP:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)


def taken() -> tuple[int, ...]:
    """The signals that end a command the Ctrl-C way: SIGINT, SIGTERM, and SIGHUP unless it was
    ignored when distrun started (nohup)."""
    hup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hup)


def _handler(signum: int, frame: Any) -> None:
    note(signum)
    raise Terminated(signal.Signals(signum).name)


def install() -> None:
    """Take SIGTERM, and SIGHUP unless it is ignored, the Ctrl-C way (from the main thread)."""
    global received
    received = None
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _handler)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _handler)


def exit_code() -> int:
    """The code of an interrupted command: 143 after SIGTERM or SIGHUP, else 130 (Ctrl-C)."""
    return int(ExitCode.TERMINATED if received is not None else ExitCode.INTERRUPTED)


def word() -> str:
    """'terminated (SIGTERM)' or 'interrupted', for the record and the error line."""
    return f"terminated ({signal.Signals(received).name})" if received is not None else "interrupted"
