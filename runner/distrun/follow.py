"""Follow a running job on every node: the head's output live, every node's fate.

One ssh session per rank host (or a local shell): the head's tails the launcher log, other
launch hosts (torchrun) wait for their launcher's exit code, the rest only keep a session
open. ssh's keepalives notice a vanished node within ~15 s; whichever node fails first ends
the job, so no rank is left waiting on a dead peer.
"""

from __future__ import annotations

import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .inventory import Cluster, Node
from .plan import JobPlan
from .remote import shell_argv

EXIT_RE = re.compile(r"^DISTRUN_EXIT (-?\d+)$")
# Seconds between ssh keepalives and how many may go unanswered before a node counts as lost.
KEEPALIVE_S = 5
KEEPALIVE_COUNT = 3


@dataclass
class Outcome:
    rc: int
    host: str | None = None  # the host whose failure ended the job
    reason: str = ""
    lost: bool = False  # the host itself went away (no exit code came back)


def _tail_command(plan: JobPlan, host: str) -> str:
    d = shlex.quote(plan.run_dir)
    pid, log, code = (shlex.quote(f"{kind}-{host}{ext}") for kind, ext in
                      (("launcher", ".pid"), ("launcher", ".log"), ("exitcode", "")))
    return (
        f"cd {d} && for i in $(seq 600); do [ -s {pid} ] && break; sleep 0.1; done; "
        f"tail -n +1 -F -s 0.5 --pid=$(cat {pid}) {log} 2>/dev/null; "
        f"for i in $(seq 50); do [ -e {code} ] && break; sleep 0.1; done; "
        f'echo; echo "DISTRUN_EXIT $(cat {code} 2>/dev/null || echo 255)"'
    )


def _wait_command(plan: JobPlan, host: str) -> str:
    d = shlex.quote(plan.run_dir)
    code = shlex.quote(f"exitcode-{host}")
    return (
        f"cd {d} && while [ ! -e {code} ]; do sleep 1; done; "
        f'echo "DISTRUN_EXIT $(cat {code})"'
    )


def _heartbeat_command() -> str:
    # Output every few seconds keeps the session honest; ssh keepalives catch a dead node.
    return f"while sleep {KEEPALIVE_S}; do echo; done"


def _with_keepalive(argv: list[str]) -> list[str]:
    if argv and argv[0] == "ssh":
        return ["ssh", "-o", f"ServerAliveInterval={KEEPALIVE_S}", "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}", *argv[1:]]
    return argv


def follow(cluster: Cluster, plan: JobPlan, launch_hosts: list[str], on_line: Callable[[str], None]) -> Outcome:
    """Block until the head's launcher exits or any node fails; return what ended the job."""
    nodes: dict[str, Node] = {n.name: n for n in cluster.nodes}
    head = plan.head.name
    events: queue.Queue[tuple[str, str, str | int]] = queue.Queue()
    procs: dict[str, subprocess.Popen[str]] = {}

    def reader(host: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            m = EXIT_RE.match(text.strip())
            if m:
                events.put((host, "exit", int(m.group(1))))
            elif host == head:
                events.put((host, "line", text))
        events.put((host, "closed", proc.wait()))

    for h in dict.fromkeys([head, *(x.name for x in plan.hosts)]):
        if h == head:
            command = _tail_command(plan, h)
        elif h in launch_hosts:
            command = _wait_command(plan, h)
        else:
            command = _heartbeat_command()
        proc = subprocess.Popen(_with_keepalive(shell_argv(nodes[h], command)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        procs[h] = proc
        threading.Thread(target=reader, args=(h, proc), daemon=True).start()

    exited: dict[str, int] = {}
    try:
        while True:
            try:
                # A timeout, not a bare get(): a signal that lands on a reader thread only sets a
                # flag, and Ctrl-C would wait for the job's next output line to take effect.
                host, kind, value = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "line":
                on_line(str(value))
            elif kind == "exit":
                exited[host] = int(value)
                if host == head:
                    # The head's launcher is done; other launchers (torchrun) must agree.
                    bad = {h: rc for h, rc in exited.items() if rc != 0}
                    if int(value) != 0:
                        return Outcome(int(value), head, f"launcher on {head} exited {value}")
                    waiting = [h for h in launch_hosts if h not in exited]
                    if not waiting:
                        return Outcome(0) if not bad else Outcome(next(iter(bad.values())), next(iter(bad)))
                elif int(value) != 0:
                    return Outcome(int(value), host, f"launcher on {host} exited {value}")
                elif head in exited and all(h in exited for h in launch_hosts):
                    return Outcome(0)
            elif kind == "closed" and host not in exited:
                # The session ended without an exit code: the node (or our way to it) is gone.
                return Outcome(255, host, f"lost contact with {host} (ssh exit {value})", lost=True)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
