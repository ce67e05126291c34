"""What a finished run's output says: its result, which rank failed first and where, the rank
logs collected from the nodes, and hints for the error texts distrun knows how to fix."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distrun.launchers import LAUNCHERS, Launcher
from distrun.transport.rundir import ATTEMPTS, collected_attempt

EPOCH_RE = re.compile(r"DISTRUN_EPOCH (\{.*\})")
RESULT_RE = re.compile(r"DISTRUN_RESULT (\{.*\})")
RANK_HEADER_RE = re.compile(r"DISTRUN_RANK rank=(\d+)")
RANK_HOST_RE = re.compile(r"DISTRUN_RANK rank=(\d+) \S+ \S+ host=(\S+)")
# A launcher's own account of a node that ended its job (Slurm's driver prints it).
FAILED_HOST_RE = re.compile(r"DISTRUN_FAILED_HOST (\S+) (.*)")

# Known error texts of failed runs (regular expressions, matched across lines) and what fixes
# them, shown in the run's summary; a fix may name what its pattern captured ({node}, {exe}).
DIAGNOSES: tuple[tuple[str, str], ...] = (
    (r"could not access\s+or execute an executable:\s+Executable:\s*(?P<exe>\S+)\s+Node:\s*(?P<node>\S+)",
     "{node} cannot run {exe}: is the shared folder mounted there? 'distrun check' names it; "
     "fix: run 'distrun setup --tags shared_fs'"),
    (r"relay join: (?:no relay of run \S+ attempt \d+ on (?P<node>\S+)|the process listening as the relay)",
     "mpirun's daemon could not join the run's unit on a node (its relay did not start there, or another process "
     "of the training account holds its name): that node's launcher-<node>.log in the attempt's folder says "
     "which; run 'distrun check'"),
    (r"distrun mesh key on (?P<node>\S+): refused",
     "{node} refused what mpirun sent over the cluster's ssh key, which runs distrun's own transfers and daemons "
     "only: drop the --launcher-args or Open MPI setting that changes how mpirun starts its daemons; after "
     "installing another distrun, run 'distrun setup'"),
    (r"orted: command not found",
     "remote nodes cannot find Open MPI: run 'distrun setup' so every node has the env, and keep mpirun's --prefix"),
    (r"ssh: Could not resolve hostname (?P<node>[^:\s]+)", "the head cannot resolve {node}: correct /etc/hosts or DNS "
     "(role base manages /etc/hosts: 'distrun setup --tags base')"),
    (r"Permission denied \(publickey", "the training user cannot ssh between nodes: run 'distrun setup --tags ssh_mesh'"),
    (r"Host key verification failed", "a node's host key is not in known_hosts (a node was rebuilt?): run 'distrun setup --tags ssh_mesh'"),
    (r"unable to reach each other for\s+MPI communications",
     "two ranks cannot reach each other over MPI: a firewall or a wrong interface between nodes; run 'distrun check'"),
    (r"RendezvousTimeoutError", "not every node joined the torchrun rendezvous: check 'distrun check' (ports, firewall, interface)"),
    (r"RendezvousConnectionError",
     "nodes cannot reach the rendezvous on the head: check the port and the network interface ('distrun check')"),
    # slurmstepd enters a task's directory and opens its output as root with only the effective uid
    # switched: a FUSE mount without allow_other refuses that, and the task never starts.
    (r"slurmstepd-(?P<node>[^:\s]+): error: couldn't chdir to `[^']*': Permission denied",
     "Slurm cannot start tasks in the shared folder on {node} (an sshfs mount without allow_other refuses "
     "slurmstepd): set shared_fs_sshfs_allow_other: true (the default) and run 'distrun setup --tags shared_fs'"),
    (r"There are not enough slots available", "more ranks than slots: lower --np or raise 'slots' in the inventory"),
    (r"ModuleNotFoundError", "a Python package is missing in the env on a node: add it to mpi_env_packages and run 'distrun setup'"),
    # The trainers' own words (workloads/gcn_jittor.py, workloads/common.py).
    (r"(?:has \d+ parts|--num-parts \d+) but MPI started \d+ ranks",
     "the partition's part count differs from the number of ranks: 'distrun train' partitions for each --np; "
     "by hand, partition again with --num-parts equal to the rank count ('distrun partition --np N')"),
)
# Said only when nothing above explains the failure: Open MPI's catch-all for a daemon that did not start.
FALLBACK_DIAGNOSES: tuple[tuple[str, str], ...] = (
    (r"ORTE was unable to reliably start one or more daemons",
     "Open MPI could not start its daemon on a node (ssh, the env or /tmp there): run 'distrun check'"),
)


def diagnose(text: str) -> list[str]:
    """The hints for a failed run's launcher output, most specific first."""
    hints = [fix.format(**m.groupdict()) for pattern, fix in DIAGNOSES if (m := re.search(pattern, text))]
    if not hints:
        hints = [fix.format(**m.groupdict()) for pattern, fix in FALLBACK_DIAGNOSES if (m := re.search(pattern, text))]
    return hints


def epoch(text: str) -> dict[str, Any] | None:
    """The progress a workload printed on one line (DISTRUN_EPOCH {json}), or None."""
    m = EPOCH_RE.search(text)
    if not m:
        return None
    try:
        value = json.loads(m.group(1))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def result(lines: list[str]) -> dict[str, Any] | None:
    """The last DISTRUN_RESULT {json} the run printed, or None."""
    for text in reversed(lines):
        m = RESULT_RE.search(text)
        if m:
            try:
                value = json.loads(m.group(1))
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def rank_logs(nodes_dir: Path) -> dict[int, Path]:
    """Rank -> its log among the collected files (where a launcher keeps its ranks' logs:
    ``Launcher.rank_log_files``), from the header line every rank prints; the last attempt's
    (rundir.collected_attempt: the other attempts' logs lie beside it, or, in a run recorded before
    attempt folders, under attempts/: store/retiring.py)."""
    last = collected_attempt(nodes_dir)
    patterns = {p for launcher in LAUNCHERS.values() for p in launcher.rank_log_files}
    found: dict[int, Path] = {}
    for host in sorted(p for p in nodes_dir.glob("*") if p.is_dir()):
        base = host / last if last else host
        for f in sorted(base.rglob("*")):
            rel = f.relative_to(base)
            if not f.is_file() or not any(fnmatch.fnmatchcase(rel.as_posix(), p) for p in patterns) or (
                    not last and ATTEMPTS in rel.parts):
                continue
            try:
                with f.open(errors="replace") as fh:
                    head = fh.readline()
            except OSError:
                continue
            m = RANK_HEADER_RE.search(head)
            if m:
                found.setdefault(int(m.group(1)), f)
    return found


def failed_host(lines: list[str], launcher: Launcher) -> str | None:
    """The host of the rank that failed first, when the launcher's output and the rank headers say."""
    text = "\n".join(lines)
    rank = launcher.failed_rank(text)
    if rank is None:
        return None
    return {int(m[1]): m[2] for m in RANK_HOST_RE.finditer(text)}.get(rank)


@dataclass(frozen=True)
class NodeFailure:
    """The runner's own account of the node that ended a run (lost, or its launcher failed)."""

    host: str
    reason: str


def first_failure(lines: list[str], launcher: Launcher, node: NodeFailure | None = None) -> str:
    """The first failing rank and its host, from what the launcher and the wrapper printed:
    ``; first failing rank 1 on node2``, else the runner's account of the node that failed, else
    the launcher's."""
    text = "\n".join(lines)
    rank = launcher.failed_rank(text)
    if rank is not None:
        hosts = {int(m[1]): m[2] for m in RANK_HOST_RE.finditer(text)}
        host = hosts.get(rank)
        return f"; first failing rank {rank}" + (f" on {host}" if host else "")
    if node is not None:
        return f"; {node.reason}"
    m = FAILED_HOST_RE.search(text)
    if m:
        return f"; {m.group(2)}"
    return ""


@dataclass
class RunSummary:
    """How a run ended, for the record and the UI."""

    run_id: str
    rc: int  # the launcher's exit code
    exit_code: int  # distrun's (the launcher maps its own)
    elapsed: float
    world_size: int
    logs_dir: Path
    logs_collected: int
    result: dict[str, Any] | None = None
    failure: str = ""  # "; first failing rank N on HOST" or the node's account
    hints: list[str] = field(default_factory=list)
    # What the run's job wrote that stayed on the nodes (over the small-file size): files, bytes.
    left_files: int = 0
    left_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def accuracy(self) -> str:
        return f" test_acc={self.result.get('test_acc')}" if self.result else ""

    @property
    def text(self) -> str:
        """The one line the run record keeps."""
        return f"ok{self.accuracy}" if self.ok else f"failed rc={self.rc}{self.failure}"


def summarise(run_id: str, rc: int, elapsed: float, lines: list[str], launcher: Launcher, world_size: int,
              nodes_dir: Path, node: NodeFailure | None = None) -> RunSummary:
    """Read what a finished run printed and what was collected from its nodes; ``node``: the node
    that ended it, as the runner saw it."""
    logs = rank_logs(nodes_dir)
    summary = RunSummary(run_id, rc, launcher.exit_code(rc), elapsed, world_size, nodes_dir, len(logs), result(lines))
    if rc != 0:
        lines = [*lines, *launcher.failure_lines(logs)]
        summary.failure = first_failure(lines, launcher, node)
        summary.hints = diagnose("\n".join(lines))
    return summary
