"""One run at a time on a host: a run claims its hosts before it stages anything.

A run takes its claim while ansible-playbook starts (pending.py): run.yml's stage step waits for
its answer, which the controller writes to a gate file, so nothing is staged on a host the run
does not hold, and the answer costs the run no time of its own.

A host is busy for a new run when another run's controller holds the host's claim, or when
processes of another run live there. Neither can go stale. The claim is a lock held by the node
program's claim (role job's files/node.py) in an ssh session of the controller that took it: it
ends with that session, when the controller exits or is killed, and at most 20 s after the
controller's last heartbeat when its machine sleeps. The processes are the run itself, found by
the same scan 'distrun stop' uses, so a detached run keeps its hosts busy exactly as long as it runs.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster
from distrun.printable import printable
from distrun.store.runs import RUN_ID_RE
from distrun.transport import nodeprog
from distrun.transport.remote import node_command, shell_argv

HEARTBEAT_S = 5
# Seconds a claim outlives its controller's last heartbeat (a laptop that sleeps sends none).
HOLD_S = 20
ANSWER_TIMEOUT_S = 30
# Where the claim looks for the processes of other runs (one folder per process, as in /proc).
PROC = "/proc"


def claim_command(host: str, run_id: str, user: str, gpus: tuple[int, ...] = (), total: int = 0,
                  *, ask: bool = False, people: bool = False) -> str:
    """On host, as root where the connection can be root (else as the training user): the node
    program's claim, which takes the host (or only ``gpus`` of its ``total``) and holds it while
    the controller's heartbeats come, or says who holds it, or which other runs have processes
    there (its scan: role job's files/node.py says by what evidence; files/claim.py the rules).
    ``ask``: only which GPUs are free there."""
    cfg: dict[str, object] = {"host": host, "run": run_id, "hold_s": HOLD_S, "proc": PROC, "user": user}
    if gpus:
        cfg["gpu_ids"] = list(gpus)
    if total:
        cfg["total"] = total
    if ask:
        cfg["ask"] = True
    return node_command(user, "claim", cfg, people=people)


@dataclass
class Answer:
    host: str
    claimed: bool = False
    busy_with: list[str] = field(default_factory=list)  # run ids; "" for a run that could not be named
    held: bool = False  # busy because another controller holds the claim (it is starting or following)
    error: str = ""
    gpus: tuple[int, ...] = ()  # of the GPUs asked, those the runs named hold (none: they hold the whole host)
    free: tuple[int, ...] | None = None  # the host's GPUs no live run holds, where its count was given
    owners: dict[str, str] = field(default_factory=dict)  # run -> the account that holds it, where recorded


def _ints(value: object) -> tuple[int, ...]:
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool)) if isinstance(value, list) else ()


def parse_answer(host: str, line: str) -> Answer:
    """The claim's first line: its JSON answer, or, when it is none, the line as the error."""
    got = nodeprog.answer(line, "claim")
    if got is None:
        return Answer(host, error=line.strip()[:200] or "no answer")
    if got.get("claimed") is True:
        return Answer(host, claimed=True)
    runs = got.get("runs")
    if got.get("error") or not isinstance(runs, list):
        return Answer(host, error=str(got.get("error") or "no runs in the claim's answer")[:200])
    ids = [r if isinstance(r, str) and RUN_ID_RE.fullmatch(r) else "" for r in runs]
    owners = got.get("owners")
    owners = owners if isinstance(owners, dict) else {}
    free = _ints(got["free"]) if isinstance(got.get("free"), list) else None
    return Answer(host, busy_with=ids if got.get("asked") else ids or [""], held=got.get("held") is True,
                  gpus=_ints(got.get("gpu_ids")), free=free,
                  owners={r: printable(str(o))[:40] for r, o in owners.items() if r in ids and o})


class Claim:
    """The hosts a run holds; release() lets them go (they also go when this process dies)."""

    def __init__(self, procs: dict[str, subprocess.Popen[str]]) -> None:
        self.procs = procs
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    @property
    def hosts(self) -> list[str]:
        return list(self.procs)

    def _beat(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            for proc in self.procs.values():
                try:
                    assert proc.stdin is not None
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                except (OSError, ValueError):
                    pass  # that session ended; the run's processes keep the host busy

    def release(self) -> None:
        self.stopped.set()
        for proc in self.procs.values():
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _end(proc)


def _gpu_refusal(a: Answer, wanted: tuple[int, ...], user: str) -> str:
    """One host whose GPUs another run holds: the host, the GPUs, the run (its owner where it is
    not the caller) and the fix, GPUs that are free there or the wait."""
    runs = [r for r in a.busy_with if r]
    named = ", ".join(f"{r} (of {a.owners[r]})" if a.owners.get(r) and a.owners[r] != user else r for r in runs)
    ids = ",".join(map(str, a.gpus))
    how = "starting there now" if a.held else "running there now"
    fix = f"choose free ones (--hosts {a.host}:{','.join(map(str, a.free[:len(wanted)]))}), " \
        if a.free is not None and len(a.free) >= len(wanted) else ""
    stop = f"'distrun stop {runs[0]}'" if runs else "'distrun stop RUN'"
    return (f"{a.host}: GPU{'s' if len(a.gpus) > 1 else ''} {ids} {'are' if len(a.gpus) > 1 else 'is'} held by run "
            f"{named or '(unnamed)'} ({how}): {fix}wait for it to end, or stop it with {stop}")


def refusal(answers: list[Answer], gpus: Mapping[str, tuple[int, ...]] | None = None, user: str = "") -> UserError:
    """The one line that refuses a run on busy hosts, naming the runs that hold them (and, where
    the run asked for GPUs another run holds, those GPUs and the free ones)."""
    busy = [a for a in answers if a.busy_with]
    if any(a.gpus for a in busy):
        return UserError("; ".join(_gpu_refusal(a, (gpus or {}).get(a.host, ()), user) if a.gpus
                                   else str(refusal([a])).removesuffix(", or pass --allow-concurrent") for a in busy)
                         + " (or pass --allow-concurrent)", exit_code=ExitCode.BUSY)
    runs = list(dict.fromkeys(r for a in busy for r in a.busy_with if r))
    hosts = ", ".join(a.host for a in busy)
    named = f"run {', '.join(runs)}" if runs else "another run"
    how = "starting there now" if all(a.held for a in busy) else "running there now"
    stop = f"stop it with 'distrun stop {runs[0]}'" if runs else "stop it with 'distrun stop RUN'"
    return UserError(f"{hosts} {'is' if len(busy) == 1 else 'are'} busy with {named} ({how}): wait for it to end, "
                     f"{stop}, or pass --allow-concurrent", exit_code=ExitCode.BUSY)


def waiting_line(answers: list[Answer], bound_s: int) -> str:
    """The one line said when a run starts waiting for hosts or GPUs another run holds."""
    held = []
    for a in (a for a in answers if a.busy_with):
        runs = [r for r in a.busy_with if r]
        by = f"run {', '.join(runs)}" if runs else "another run"
        what = f"{a.host}'s GPU{'s' if len(a.gpus) > 1 else ''} {','.join(map(str, a.gpus))}" if a.gpus else a.host
        held.append(f"{what} held by {by}")
    return f"waiting up to {bound_s} s for {'; '.join(held)} (Ctrl-C gives up, leaving nothing claimed)"


def _ask(cluster: Cluster, hosts: list[str], run_id: str, gpus: Mapping[str, tuple[int, ...]] | None,
         procs: dict[str, subprocess.Popen[str]], *, ask: bool = False) -> list[Answer]:
    """Ask every host of ``hosts`` for the claim (of its GPUs in ``gpus``) at once: each one's
    shell, added to ``procs`` as it starts, and the answers that came within the timeout."""
    nodes = {n.name: n for n in cluster.nodes}
    asked = len(procs)
    answers: queue.Queue[Answer] = queue.Queue()

    def first_line(host: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        answers.put(parse_answer(host, line) if line else Answer(host, error=f"no answer (exit {proc.wait()})"))

    for h in hosts:
        try:
            argv = shell_argv(nodes[h], claim_command(h, run_id, cluster.user, (gpus or {}).get(h, ()), nodes[h].gpus,
                                                      ask=ask, people=cluster.has_people))
        except UserError:
            continue  # a host distrun cannot open a shell on: the preflight refuses it
        procs[h] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=first_line, args=(h, procs[h]), daemon=True).start()
    got: list[Answer] = []
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while len(got) < len(procs) - asked:
        try:
            got.append(answers.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
    return got


def claim(cluster: Cluster, hosts: list[str], run_id: str, gpus: Mapping[str, tuple[int, ...]] | None = None) -> Claim:
    """Claim every host for run_id, or on the hosts ``gpus`` names, only those GPUs (a host
    without GPUs there is claimed whole); UserError naming the busy hosts and their runs. The
    first host (the head, which every run holds) is claimed first and alone: two runs started
    together then meet there, and one of them holds every host while the other is refused, never
    each a part (two GPU runs may both hold it, on disjoint GPUs). The others are claimed at once.
    A host that does not answer is not claimed: the preflight names it."""
    got = try_claim(cluster, hosts, run_id, gpus)
    if isinstance(got, Claim):
        return got
    raise refusal(got, gpus, cluster.user)


def try_claim(cluster: Cluster, hosts: list[str], run_id: str,
              gpus: Mapping[str, tuple[int, ...]] | None = None) -> Claim | list[Answer]:
    """claim()'s one try: the claim, or every host's answer (in ``hosts`` order) where any is
    busy, holding nothing. Interrupted, it leaves nothing claimed either."""
    hosts = list(dict.fromkeys(hosts))
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        got = _ask(cluster, hosts[:1], run_id, gpus, procs)
        if not any(a.busy_with for a in got) and hosts[1:]:
            got += _ask(cluster, hosts[1:], run_id, gpus, procs)
    except BaseException:
        for proc in procs.values():
            _end(proc)
        raise
    held = Claim({a.host: procs[a.host] for a in got if a.claimed})
    if any(a.busy_with for a in got):
        held.release()
        for proc in procs.values():
            _end(proc)
        return sorted(got, key=lambda a: hosts.index(a.host))
    for h, proc in procs.items():
        if h not in held.procs:
            _end(proc)
    return held


def free_gpus(cluster: Cluster, hosts: list[str], run_id: str) -> dict[str, tuple[int, ...]]:
    """Which GPUs of each host no live run holds, by the hosts' claims (taking nothing): what
    placement picks from when a run gives a count of GPUs and no indices. A host that did not
    answer is left out (the plan then takes its first GPUs and the claim says who holds them)."""
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        got = _ask(cluster, list(dict.fromkeys(hosts)), run_id, None, procs, ask=True)
    finally:
        for proc in procs.values():
            _end(proc)
    return {a.host: a.free for a in got if a.free is not None and not a.error}


def _end(proc: subprocess.Popen[str]) -> None:
    """End a claim's shell and wait until it is gone: a refused claim may have taken a host's lock
    before it found another run's processes there, and a shell still exiting would hold the lock
    against the next claim (seen as "starting there now")."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
