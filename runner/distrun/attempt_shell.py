"""The shell lines the runner sends to a node for one attempt's launcher, as the training user:
start its launch script detached, follow the head's launcher log, wait for another launch
host's exit code, stop it. Every path is the attempt's own (rundir.py).

A line a follower waits for is printed only when its value is real: ``DISTRUN_EXIT <code>``
once the launcher wrote its exit code, else one ``DISTRUN_ERROR <host>: ...`` line saying what
is wrong, on which path. None of them waits for ever: a launcher that never wrote its pid file
is named after START_WAIT_S, and one whose launch script is no longer alive without an exit
code (killed, or its pid now another program's) is named as such.
"""

from __future__ import annotations

import shlex

from . import nodeprog, rundir
from .plan import JobPlan
from .remote import as_user


def _enter(plan: JobPlan, host: str) -> str:
    """Name the host, the run dir, the attempt's folder (w: its full path) and the user once,
    quoted, as shell variables, with the attempt's file names of this host (p: pid, l: log,
    x: exit code, s: launch script); enter the folder or say why not. Every later line uses the
    variables, so no inventory value is parsed by the shell twice."""
    names = {"p": rundir.launcher_pid(host), "l": rundir.launcher_log(host), "x": rundir.exit_code(host),
             "s": rundir.launch_script(host)}
    return (
        f"set -e; h={shlex.quote(host)}; d={shlex.quote(plan.run_dir)}; a={shlex.quote(rundir.attempt_folder(plan) or '.')}; "
        f"w={shlex.quote(rundir.attempt_path(plan))}; u={shlex.quote(plan.user)}; "
        + "".join(f"{k}={shlex.quote(v)}; " for k, v in names.items())
        + 'cd "$d" 2>/dev/null || { echo "DISTRUN_ERROR $h: cannot enter the run directory $d '
        "as user $u (is the shared folder mounted, and is it the training user's?)\"; exit 3; }; "
        'cd "$a" 2>/dev/null || { echo "DISTRUN_ERROR $h: cannot enter $w as user $u (the attempt was not staged '
        'there)"; exit 3; }; '
    )


def _exit_marker() -> str:
    """Print the launcher's exit code as DISTRUN_EXIT only when it is one; else say what is wrong."""
    return (
        '[ -e "$x" ] || { echo "DISTRUN_ERROR $h: the launcher ended without writing $w/$x"; exit 4; }; '
        'rc=$(cat "$x" 2>/dev/null) || { echo "DISTRUN_ERROR $h: cannot read $w/$x as user $u"; exit 4; }; '
        'case "$rc" in ""|*[!0-9-]*) echo "DISTRUN_ERROR $h: $w/$x holds no exit code"; exit 4;; esac; '
        'echo; echo "DISTRUN_EXIT $rc"'
    )


# Seconds a follower waits for a launcher's pid file before it says the launcher did not start.
START_WAIT_S = 60


def _await_pid() -> str:
    """Wait for the launcher's pid file (or its exit code): pid= its number; after START_WAIT_S
    without either, say the launcher did not start."""
    return (
        f'pid=; for i in $(seq {START_WAIT_S * 10}); do [ -e "$x" ] && break; '
        'read -r pid < "$p" 2>/dev/null || pid=; case "$pid" in ""|*[!0-9]*) pid=;; *) break;; esac; sleep 0.1; done; '
        '[ -e "$x" ] || [ -n "$pid" ] || { echo "DISTRUN_ERROR $h: the launcher did not start: no $w/$p '
        f'after {START_WAIT_S} s"; exit 4; }}; '
        # The launch script's own shell, alive (not a zombie, not a pid reused by another program).
        'ours() { tr "\\0" " " < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$s"; }; '
    )


def launch_command(plan: JobPlan, host: str) -> str:
    """Start host's launch script detached (its own session: the job outlives this ssh session),
    with an environment of its own rather than this session's (no ssh variables, no controller
    locale): the training user's home, user name and PATH, and C.UTF-8."""
    return as_user(plan.user, (
        _enter(plan, host)
        + '[ -f "$s" ] || { echo "DISTRUN_ERROR $h: there is no launch script $w/$s"; exit 4; }; '
        'setsid -f env -i HOME="$HOME" USER="$u" LOGNAME="$u" SHELL=/bin/bash PATH="$PATH" LANG=C.UTF-8 '
        'bash "$s" > /dev/null 2>&1 < /dev/null; echo DISTRUN_LAUNCHED'
    ))


def tail_command(plan: JobPlan, host: str) -> str:
    """The head's session: follow the launcher's log until the launcher exits, then its exit code."""
    return as_user(plan.user, (
        _enter(plan, host)
        + _await_pid()
        # tail ends with the launcher (it looks every 0.02 s: the run's end is noticed at once, for
        # a syscall, not a process, per look); the exit code below, not tail's, says how it ended.
        + 'if [ -n "$pid" ]; then tail -n +1 -F -s 0.02 --pid="$pid" "$l" 2>/dev/null || :; '
        'else tail -n +1 "$l" 2>/dev/null || :; fi; '
        'for i in $(seq 50); do [ -e "$x" ] && break; sleep 0.1; done; '
        + _exit_marker()
    ))


def wait_command(plan: JobPlan, host: str) -> str:
    """Another launch host's session (torchrun): wait for its launcher's exit code. It ends when
    the launch script has ended, with its exit code or, where none came, saying so."""
    return as_user(plan.user, (
        _enter(plan, host)
        + _await_pid()
        # A run dir that stops being readable (a dropped mount, changed permissions) is said as
        # such, not waited on forever.
        # The launch script writes the exit code as it ends: waiting on its pid (tail looks every
        # 0.02 s) notices the end at once; the folder is checked every 2 s meanwhile.
        + 'while [ ! -e "$x" ] && ours; do '
        '[ -r "$d" ] && [ -x "$d" ] || { echo "DISTRUN_ERROR $h: the run directory $d is no longer readable '
        'as user $u (is the shared folder still mounted?)"; exit 3; }; '
        'timeout 2 tail -f /dev/null -s 0.02 --pid="$pid" 2>/dev/null || :; done; '
        'for i in $(seq 50); do [ -e "$x" ] && break; sleep 0.1; done; '
        + _exit_marker()
    ))


STOP_GRACE_S = 8  # TERM, then KILL to what outlives it: within run_each's 15 s for the stop


def stop_command(plan: JobPlan) -> str:
    """End the launcher of the node it reaches and everything it started: the node program's stop
    of the run, which finds its processes by evidence the job cannot point at another run's
    (never a pid file the job could have rewritten)."""
    return as_user(plan.user, nodeprog.command(
        "stop", {"run": plan.run_id, "run_dir": plan.run_dir, "grace_s": STOP_GRACE_S}))
