"""What a run is doing on its nodes now: the live state a record is reconciled with.

A record says what its controller last wrote. When no controller follows the run any more (a
detached run, a controller killed, a laptop that slept), the nodes say the rest: on each rank
host, whether the run's launcher still runs or the exit code it wrote, which ranks started, how
many of the run's processes live. From that, a run is running, finished with its real exit code,
lost (its launcher ended without one) or unreachable (no answer from a launch host).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from distrun.errors import UserError
from distrun.inventory.cluster import Cluster, Node
from distrun.launchers import LAUNCHERS, launcher_named
from distrun.planning.jobplan import JobPlan, from_json
from distrun.run import supervision
from distrun.store.runs import RecordError, Run, RunStatus
from distrun.transport import nodeprog, rundir
from distrun.transport.nodeprog import LauncherState
from distrun.transport.remote import node_command, shell_argv

PROBE_TIMEOUT_S = 30


# A run's state when a launch host cannot be reached to tell it (beside a record's RunStatus).
UNREACHABLE = "unreachable"


@dataclass
class HostState:
    """One rank host, as its probe answered."""

    host: str
    reached: bool = True
    error: str = ""
    run_dir: bool = True  # the run's directory exists there
    launcher: LauncherState = LauncherState.NONE
    rc: int | None = None
    signal: str = ""  # the signal that ended the launcher, as root's record of its unit says ("" if none)
    procs: int = 0  # live processes of the run: in its unit there, else carrying its tag
    started: tuple[int, ...] = ()  # ranks whose wrapper ran here
    supervisor: dict[str, Any] | None = None  # a detached mpirun run's supervisor's record (run/supervision.py)

    def text(self) -> str:
        if not self.reached:
            return f"unreachable: {self.error}"
        if not self.run_dir:
            return "no run directory"
        ended = f"launcher stopped by signal {self.signal}" if self.signal else f"launcher exited {self.rc}"
        launcher = {LauncherState.RUNNING: "launcher running", LauncherState.EXITED: ended,
                    LauncherState.GONE: "launcher gone without an exit code", LauncherState.NONE: ""}[self.launcher]
        ranks = f"ranks {','.join(map(str, self.started))} started" if self.started else "no rank started"
        return ", ".join(x for x in (launcher, f"{self.procs} process(es) of the run", ranks) if x)


@dataclass
class ClusterState:
    """A run's state read from its nodes."""

    state: str  # a RunStatus (running, succeeded, failed, lost), or UNREACHABLE
    rc: int | None = None  # the launcher's exit code, once it exited
    reason: str = ""
    hosts: dict[str, HostState] = field(default_factory=dict)
    world_size: int = 0

    @property
    def started(self) -> tuple[int, ...]:
        return tuple(sorted({r for h in self.hosts.values() for r in h.started}))

    @property
    def final(self) -> bool:
        return self.state in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.LOST)


def recorded_plan(run: Run) -> JobPlan:
    """The plan a run recorded (plan.json), as the object the launchers take."""
    path = run.dir / "plan.json"
    if not path.is_file():
        raise RecordError(f"run {run.id} has no plan.json: it ended before it was planned")
    try:
        plan = from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RecordError(f"run {run.id}: {path} is unreadable ({type(exc).__name__}); this record cannot be followed") from None
    if plan.launch.launcher not in LAUNCHERS:
        raise RecordError(f"run {run.id}: launcher {plan.launch.launcher!r} is unknown to this distrun")
    return plan


def probe_command(plan: JobPlan, host: str) -> str:
    """The remote check of one host, as root with the training user's filesystem identity (as that
    user where the connection is not root): the node program's state of the attempt there, one
    JSON line (attempt.py; what a node sends back is checked, not trusted)."""
    cfg = {"run": plan.run_id, "run_dir": plan.run_dir, "host": host, "attempt": str(plan.attempt.restart),
           "dir": rundir.attempt_path(plan), "script": rundir.launch_script(host), "exit_file": rundir.exit_code(host),
           "pid_file": rundir.launcher_pid(host), "user": plan.launch.user, "started": rundir.STARTED}
    return node_command(plan.launch.user, "state", cfg, "attempt", people=plan.launch.people)


def parse_probe(host: str, output: str) -> HostState:
    """A host's state from its probe's answer; a host that gave none was not reached."""
    said = nodeprog.answer(output, "state")
    if said is None:
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no answer")
        return HostState(host, reached=False, error=last[:200])
    state = HostState(host, run_dir=said.get("dir") is True)
    launcher = said.get("launcher")
    state.launcher = LauncherState(launcher) if launcher in nodeprog.LAUNCHER_STATES else LauncherState.NONE
    rc = said.get("rc")
    state.rc = rc if isinstance(rc, int) and not isinstance(rc, bool) and -9999 <= rc <= 9999 else None
    if state.launcher == LauncherState.EXITED and state.rc is None:
        state.launcher = LauncherState.GONE  # an exit code file without a code in it
    signal = said.get("signal")
    if state.launcher == LauncherState.EXITED and isinstance(signal, str) and re.fullmatch(r"[A-Z0-9+]{1,12}", signal):
        state.signal = signal
    procs = said.get("procs")
    state.procs = procs if isinstance(procs, int) and not isinstance(procs, bool) and procs >= 0 else 0
    started = said.get("started")
    state.supervisor = supervision.parse(said.get("supervisor"))
    state.started = tuple(sorted({r for r in started if isinstance(r, int) and not isinstance(r, bool) and r >= 0})) \
        if isinstance(started, list) else ()
    return state


def _probe_one(node: Node, plan: JobPlan, timeout_s: float) -> HostState:
    try:
        proc = subprocess.run(shell_argv(node, probe_command(plan, node.name)), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HostState(node.name, reached=False, error=f"no answer within {timeout_s:.0f}s")
    except (OSError, UserError) as exc:
        return HostState(node.name, reached=False, error=str(exc))
    return parse_probe(node.name, proc.stdout + "\n" + proc.stderr)


def probe(cluster: Cluster, plan: JobPlan, timeout_s: float = PROBE_TIMEOUT_S,
          lost: set[str] | frozenset[str] = frozenset()) -> dict[str, HostState]:
    """Every rank host of the plan, all at once; hosts known ``lost`` are not asked again."""
    nodes = {n.name: n for n in cluster.nodes}
    hosts = list(plan.placement.watched_hosts)
    ask = [h for h in hosts if h in nodes and h not in lost]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(ask)))) as pool:
        futures = {h: pool.submit(_probe_one, nodes[h], plan, timeout_s) for h in ask}
    states = {h: f.result() for h, f in futures.items()}
    for h in hosts:
        if h not in states:
            why = "lost during the run" if h in lost else f"not in inventory {cluster.source} any more"
            states[h] = HostState(h, reached=False, error=why)
    return {h: states[h] for h in hosts}


def judge(plan: JobPlan, hosts: dict[str, HostState]) -> ClusterState:
    """The run's state from its hosts' answers: its launchers say whether it runs and how it ended.

    A launcher that a signal ended (root's record of its unit: its unit stopped, its node shut
    down, a kill) wrote no end of the job's. On the first launch host (the only one, or the one
    whose agent holds the rendezvous the others meet at), or on any launch host while the first
    one still runs a group that needs every host (no ``min_nodes``: torchrun's --nnodes H, whose
    ranks left wait for the stopped node's in their collectives, and nothing starts its agent
    again), the run is lost at once: the job's end will never be written. An end the first launch
    host wrote itself still decides (a stop that came after the job's end)."""
    launcher = launcher_named(plan.launch.launcher)
    launch = [h.name for h in launcher.launch_hosts(plan)]
    state = ClusterState(RunStatus.RUNNING, hosts=hosts, world_size=plan.placement.world_size)
    unreached = [h for h in launch if not hosts[h].reached]
    running = [h for h in launch if hosts[h].reached and hosts[h].launcher == LauncherState.RUNNING]
    stopped = [h for h in launch if hosts[h].reached and hosts[h].signal]
    said_stop = "; ".join(f"the launcher on {h} was stopped by signal {hosts[h].signal}" for h in stopped)
    needed = launch if not plan.attempt.min_nodes else launch[:1]
    if stopped and (launch[0] in stopped or (launch[0] in running and any(h in needed for h in stopped))):
        first = stopped[0]
        state.state = RunStatus.LOST
        state.reason = (f"the launcher on {first} was stopped by signal {hosts[first].signal} before the job ended "
                        "(its unit was stopped, its node shut down, or a process killed it), so the job's own end "
                        "will never be written" + ("; the run's other launchers cannot go on without it" if len(launch) > 1 else ""))
        if len(stopped) > 1:
            state.reason += "; " + "; ".join(f"the launcher on {h} too" for h in stopped[1:])
        if running:
            state.reason += f"; its launchers on {', '.join(running)} still run: 'distrun stop {plan.run_id}' ends them"
        return state
    if running:
        state.reason = "; ".join([f"{h} unreachable: {hosts[h].error}" for h in unreached]
                                 + ([f"{said_stop}, while the launchers on {', '.join(running)} run on"] if stopped else [])
                                 + list(filter(None, [supervision.now_text(hosts[launch[0]].supervisor,
                                                                            plan.attempt.max_restarts)])))
        return state
    if unreached:
        state.state = UNREACHABLE
        state.reason = "; ".join(f"cannot reach {h} ({hosts[h].error})" for h in unreached)
        return state
    no_dir = [h for h in launch if not hosts[h].run_dir]
    gone = [h for h in launch if hosts[h].launcher in (LauncherState.GONE, LauncherState.NONE)]
    if no_dir or gone:
        state.state = RunStatus.LOST
        if no_dir:
            state.reason = f"the run directory {plan.run_dir} is missing on {', '.join(no_dir)}"
        else:
            state.reason = (f"the launcher on {', '.join(gone)} ended without writing its exit code "
                            "(killed, stopped, or its node restarted)")
        return state
    codes = {h: int(hosts[h].rc or 0) for h in launch}
    head = plan.placement.head.name
    bad = [h for h in launch if codes[h] != 0 and h not in stopped]
    # A launcher a signal ended says nothing of the job's end: the first launch host's went on (it
    # may restart without that node: torchrun's --exclude-failed), and its own exit decides.
    rc = codes[head] if codes.get(head) and head not in stopped else (codes[bad[0]] if bad else 0)
    state.rc = rc
    state.state = RunStatus.SUCCEEDED if rc == 0 else RunStatus.FAILED
    state.reason = "; ".join(x for x in (f"the launcher exited {rc}" + (f" on {', '.join(bad)}" if bad else ""), said_stop) if x)
    return state


def out_of_contact(plan: JobPlan, hosts: dict[str, HostState], lost: set[str] | frozenset[str]) -> str | None:
    """After hosts were ``lost`` mid-run: why the run cannot be followed any more, or None when a
    launch host that is not lost still answers (the nodes left can be stopped, collected and
    restarted on). With torchrun every rank host is a launch host: one lost node must not make
    the whole run look out of reach."""
    launch = [h.name for h in launcher_named(plan.launch.launcher).launch_hosts(plan)]
    left = [h for h in launch if h not in lost]
    if any(hosts[h].reached for h in left if h in hosts):
        return None
    if not left:
        return f"every launch host of the run was lost ({', '.join(launch)})"
    return "; ".join(f"cannot reach {h} ({hosts[h].error})" for h in left if h in hosts)


def read(cluster: Cluster, plan: JobPlan, lost: set[str] | frozenset[str] = frozenset()) -> ClusterState:
    return judge(plan, probe(cluster, plan, lost=lost))


def wait_started(cluster: Cluster, plan: JobPlan, timeout_s: float,
                 on_state: Callable[[ClusterState], None] | None = None) -> ClusterState:
    """Poll the rank hosts until every rank started, or the run is no longer running, or
    ``timeout_s`` passed; the last state read."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = read(cluster, plan)
        if on_state is not None:
            on_state(state)
        if state.state != RunStatus.RUNNING or len(state.started) >= plan.placement.world_size or time.monotonic() > deadline:
            return state
        time.sleep(1)
