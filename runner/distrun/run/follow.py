"""Follow a running job on every node: the head's output live, every node's fate.

One ssh session per rank host (or a local shell): the head's tails the launcher log, other
launch hosts (torchrun) wait for their launcher's exit code, the rest only keep a session
open. ssh's keepalives notice a vanished node within ~15 s; whichever node fails first ends
the job, so no rank is left waiting on a dead peer.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from distrun.inventory.cluster import Cluster, Node
from distrun.planning.jobplan import JobPlan
from distrun.printable import printable
from distrun.run.attempt_shell import stop_command, tail_command, wait_command
from distrun.transport import nodeprog
from distrun.transport.remote import KEEPALIVE_S, run_each, shell_argv

# A remote step that failed says what failed, on which path; printed instead of an exit marker.
ERROR_RE = re.compile(r"^DISTRUN_ERROR (.+)$")
# ssh's own exit status when the connection failed (or its keepalives ran out).
SSH_FAILED = 255


@dataclass
class Outcome:
    rc: int
    host: str | None = None  # the host whose failure ended the job
    reason: str = ""
    lost: bool = False  # the host itself went away (no exit code came back)


def _heartbeat_command() -> str:
    # Output every few seconds keeps the session honest; ssh keepalives catch a dead node.
    return f"while sleep {KEEPALIVE_S}; do echo; done"


def session_ended(host: str, rc: int, output: list[str], over_ssh: bool) -> Outcome:
    """What a follower session that ended without an exit marker means.

    A DISTRUN_ERROR line is the remote step's own account (a failed cd, an unreadable file, no
    exit code); ssh's 255 is a lost transport; anything else ended the session on the node
    (e.g. sudo refused to act as the training user): its last line says why.
    """
    for text in reversed(output):
        m = ERROR_RE.match(text.strip())
        if m:
            return Outcome(rc or 1, host, m.group(1))
    last = next((t.strip() for t in reversed(output) if t.strip()), "")
    if over_ssh and rc == SSH_FAILED:
        why = f": {last}" if last else ""
        return Outcome(SSH_FAILED, host, f"lost contact with {host} (ssh failed{why})", lost=True)
    why = f": {last}" if last else " and printed nothing"
    return Outcome(rc or 1, host, f"following the launcher on {host} failed (exit {rc}){why}")


def _stop_launchers(nodes: dict[str, Node], plan: JobPlan, hosts: list[str]) -> None:
    """End the launchers on hosts at once: none is left waiting on a rendezvous that is gone."""
    stop = stop_command(plan)
    run_each(nodes, dict.fromkeys(hosts, stop), 15)


def follow(cluster: Cluster, plan: JobPlan, launch_hosts: list[str], on_line: Callable[[str], None]) -> Outcome:
    """Block until the head's launcher exits or any node fails; return what ended the job."""
    nodes: dict[str, Node] = {n.name: n for n in cluster.nodes}
    head = plan.placement.head.name
    events: queue.Queue[tuple[str, str, str | int]] = queue.Queue()
    procs: dict[str, subprocess.Popen[str]] = {}

    output: dict[str, deque[str]] = {}

    def reader(host: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        kept = output.setdefault(host, deque(maxlen=20))
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            if text.startswith(nodeprog.LOG_PREFIX):  # the launcher's log: data, whatever it says
                line = text[len(nodeprog.LOG_PREFIX):]
                if line.strip():
                    kept.append(line)
                if host == head:
                    events.put((host, "line", line))
                continue
            said = nodeprog.answer(text, "follow")
            if said is not None and isinstance(said.get("exit"), int):
                events.put((host, "exit", said["exit"]))
            elif said is not None:
                kept.append(f"DISTRUN_ERROR {printable(str(said.get('error', 'no exit code')))}")
            elif text.strip():
                kept.append(text)
        events.put((host, "closed", proc.wait()))

    for h in dict.fromkeys([head, *plan.placement.reached_hosts]):
        if h == head:
            command = tail_command(plan, h)
        elif h in launch_hosts:
            command = wait_command(plan, h)
        else:
            command = _heartbeat_command()
        # Not strict: a byte that is not UTF-8 (a node's locale, its sudo) would end the reader.
        proc = subprocess.Popen(shell_argv(nodes[h], command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                encoding="utf-8", errors="replace", bufsize=1, start_new_session=True)
        procs[h] = proc
        threading.Thread(target=reader, args=(h, proc), daemon=True).start()

    exited: dict[str, int] = {}
    outcome: Outcome | None = None
    try:
        while outcome is None:
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
                        outcome = Outcome(int(value), head, f"launcher on {head} exited {value}")
                    elif not [h for h in launch_hosts if h not in exited]:
                        outcome = Outcome(0) if not bad else Outcome(next(iter(bad.values())), next(iter(bad)))
                elif int(value) != 0:
                    outcome = Outcome(int(value), host, f"launcher on {host} exited {value}")
                elif head in exited and all(h in exited for h in launch_hosts):
                    outcome = Outcome(0)
            elif kind == "closed" and host not in exited:
                outcome = session_ended(host, int(value), list(output.get(host, ())), nodes[host].connection != "local")
        if outcome.rc != 0:
            # torchrun: the other launch hosts would wait on the failed one's rendezvous.
            others = [h for h in launch_hosts if h not in exited and h != outcome.host]
            if others:
                _stop_launchers(nodes, plan, others)
        return outcome
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
