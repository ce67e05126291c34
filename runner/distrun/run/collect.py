"""Bring a run's files home: one tar stream per node, all nodes at once (which files travel and
which stay, listed: collect_rules).

Each node sends its listing and a tar of the kept files in one stream, over one ssh connection.
A node that cannot be reached this way falls back to the playbook (file by file, the same
rule), so nothing is lost silently.
"""

from __future__ import annotations

import subprocess
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import IO, Any

from distrun.errors import UserError
from distrun.inventory.cluster import Cluster, Node
from distrun.printable import printable
from distrun.run.collect_rules import (
    COLLECT_MAX_BYTES,
    COLLECT_MAX_DEPTH,
    COLLECT_MAX_ENTRIES,
    COLLECT_MAX_FILES,
    COLLECT_TIMEOUT_S,
    SMALL_BYTES,
    Caps,
    Left,
    Selection,
    folders_of,
    plain_name,
    size_text,
)
from distrun.transport.remote import node_command, shell_argv


class Failure(StrEnum):
    """Why a node's files did not all arrive. All but OTHER are final: another way in (the
    playbook, file by file) would not fix them, so such a node is reported, not retried."""

    UNREACHABLE = "unreachable"  # ssh could not reach it (the playbook would wait for the same timeout)
    REFUSED = "refused"  # its run dir is a link, outside the runs folder, or not readable as its user
    CAPPED = "capped"  # its run dir is over the cap of bytes or files, or the pull over its time
    OTHER = "failed"  # anything else (an unpacking error, the node's command failing)


@dataclass(frozen=True)
class PullError:
    """One node's failure: its kind and the line that says why."""

    kind: Failure
    why: str

    @property
    def final(self) -> bool:
        return self.kind != Failure.OTHER

    def __str__(self) -> str:
        return self.why if self.kind == Failure.OTHER else f"{self.kind}: {self.why}"
# The pull's shell on the node exits with this when the run dir is a link or outside the runs
# folder: a code of that protocol, not one of distrun's own (those are errors.ExitCode).
_REFUSED_RC = 3
# ssh's own exit status when it could not reach the node (or the connection broke).
_SSH_FAILED_RC = 255
# How many files left on a node the record lists (a run dir of a million shards lists the first).
LIST_MAX = 10000


@dataclass
class Pulled:
    """What pull_run did: host -> why its files did not all arrive, host -> what stays there,
    host -> (files, bytes) it brought."""

    errors: dict[str, PullError] = field(default_factory=dict)
    left: dict[str, Left] = field(default_factory=dict)
    brought: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class _NodePull:
    error: PullError | None = None
    left: Left = field(default_factory=Left)
    files: int = 0
    bytes: int = 0


def collect_hosts(cluster: Cluster, rank_hosts: list[str]) -> list[str]:
    """Hosts holding files of the run (the hosts that stage them, too): on a shared folder the
    head holds everyone's."""
    if cluster.shared_fs_mode == "sync":
        return list(dict.fromkeys([cluster.head.name, *rank_hosts]))
    return [cluster.head.name]


# Python's own refusals for untrusted archives (3.12+, and 3.11.4+), besides _safe's: named, so
# no Python warns that its default is about to change.
_DATA_FILTER: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def _safe(member: tarfile.TarInfo) -> bool:
    """Only plain files and folders inside the destination: a node's run dir is not trusted
    to write elsewhere on this machine (no absolute paths, '..', links or devices)."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        return False
    return member.isfile() or member.isdir()


def pack_command(run_dir: str, user: str, selection: Selection, max_files: int = COLLECT_MAX_FILES,
                 max_entries: int = COLLECT_MAX_ENTRIES, max_depth: int = COLLECT_MAX_DEPTH, people: bool = False) -> str:
    """The node-side command: role job's files/pack.py, root with the training user's filesystem
    identity where the connection can be root (else that user): it refuses a run dir that is a
    link, whose runs folder is a link, or that is not where it should be once every link above it
    is resolved (exit 3), then prints the files the selection leaves (``size<TAB>path<NUL>`` each,
    when it lists them), one more NUL, and a tar of the plain files it selects, never through a
    link, down to ``max_depth`` folders, with names that are text only, stopping one file past
    ``max_files`` or one entry past ``max_entries`` (files and the folders they need)."""
    cfg = {"user": user, "run_dir": run_dir, "patterns": selection.regex(), "never": selection.never_regex(),
           "small": SMALL_BYTES if selection.small else -1,
           "listed": selection.listed, "gzip": selection.gzip, "max_files": max_files, "max_entries": max_entries,
           "max_depth": max_depth, "list_max": LIST_MAX}
    return node_command(user, "pack", cfg, "pack", people=people)


class _Rest:
    """A stream some of whose bytes were already read: those first, then the rest."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            return out
        return self.stream.read(n)


def read_listing(stream: IO[bytes]) -> tuple[Left, bytes]:
    """The listing at the head of a node's stream, and the bytes read past it (the tar's start).
    A node's listing is not trusted: records that are not ``digits<TAB>path`` are dropped."""
    buf = b""
    while True:
        if buf[:1] == b"\0":
            end = 0
            break
        end = buf.find(b"\0\0")
        if end >= 0:
            end += 1
            break
        chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
        if not chunk:
            raise EOFError("the node's stream ended before its file listing did")
        buf += chunk
    left = Left()
    for record in buf[:end].split(b"\0"):
        size, _, path = record.decode(errors="replace").partition("\t")
        if not path or not size.isdigit() or "\n" in path:
            continue
        if len(left.files) == LIST_MAX:
            left.more = True
            break
        left.files.append((int(size), path))
    return left, buf[end + 1:]


def _pull(node: Node, run_dir: str, dest: Path, *, user: str, selection: Selection, caps: Caps,
          people: bool = False) -> _NodePull:
    """Unpack node's selected files of run_dir into dest: why it failed (or None), what stays there, what came."""
    out = _NodePull()
    out.error = _stream(node, run_dir, dest, user=user, selection=selection, caps=caps, out=out, people=people)
    return out


def _stream(node: Node, run_dir: str, dest: Path, *, user: str, selection: Selection, caps: Caps,
            out: _NodePull, people: bool = False) -> PullError | None:
    """_pull's stream, counting into ``out``; why it failed, or None."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    command = pack_command(run_dir, user, selection, caps.max_files, caps.max_entries, caps.max_depth, people)
    timeout_s = caps.timeout_s
    try:
        proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, UserError) as exc:
        return PullError(Failure.OTHER, str(exc))
    assert proc.stdout is not None
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    capped = ""
    folders: set[str] = set()
    try:
        out.left, rest = read_listing(proc.stdout)
        with tarfile.open(fileobj=_Rest(rest, proc.stdout), mode="r|*") as tar:  # type: ignore[call-overload]
            for member in tar:
                if not _safe(member) or not plain_name(member.name):
                    if not plain_name(member.name):  # never stored: it stays on the node, listed
                        out.left.files.append((member.size, printable(member.name.encode(errors="surrogateescape")
                                                                      .decode(errors="backslashreplace"))))
                    continue
                capped = caps.passed(member, out.files, out.bytes, folders)
                if capped:
                    break
                tar.extract(member, dest, set_attrs=False, **_DATA_FILTER)
                folders |= folders_of(member)
                if member.isfile():
                    out.files += 1
                    out.bytes += member.size
    except (tarfile.TarError, OSError, EOFError) as exc:
        if not timed_out.is_set():
            try:
                proc.wait(timeout=5)  # an empty stream: the node's command ended (a refusal?)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode == _REFUSED_RC:
                return PullError(Failure.REFUSED, _last_line(proc))
            if proc.returncode == _SSH_FAILED_RC and node.connection != "local":
                return PullError(Failure.UNREACHABLE, _last_line(proc) or "ssh failed")
            return PullError(Failure.OTHER, f"unpacking failed: {exc}")
    finally:
        timer.cancel()
    if capped:
        proc.kill()
        proc.wait()
        raise_var = ("DISTRUN_COLLECT_MAX_MB" if "MiB" in capped else "DISTRUN_COLLECT_MAX_DEPTH" if "deep" in capped
                     else "DISTRUN_COLLECT_MAX_ENTRIES" if "folders" in capped else "DISTRUN_COLLECT_MAX_FILES")
        return PullError(Failure.CAPPED, f"stopped at {capped} after {out.files} file(s) ({_size(out.bytes)}); "
                         f"the rest stays in {run_dir} on {node.name} (to bring it: raise {raise_var} and "
                         f"'distrun fetch RUN PATH')")
    if timed_out.is_set():
        proc.wait()
        return PullError(Failure.CAPPED, f"stopped after {timeout_s:.0f}s with {out.files} file(s) ({_size(out.bytes)}); "
                         f"the rest stays in {run_dir} on {node.name} (raise DISTRUN_COLLECT_TIMEOUT_S to wait longer)")
    rc = proc.wait()
    if rc == _REFUSED_RC:
        return PullError(Failure.REFUSED, _last_line(proc))
    if rc != 0:
        why = _last_line(proc) or f"exit {rc}"
        unreached = rc == _SSH_FAILED_RC and node.connection != "local"
        return PullError(Failure.UNREACHABLE if unreached else Failure.OTHER, why)
    return None


def _last_line(proc: subprocess.Popen) -> str:
    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
    return err[-1] if err else ""


def _size(n: int) -> str:
    return size_text(n)


def pull_run(cluster: Cluster, run_dir: str, hosts: list[str], dest: Path, selection: Selection, *,
             max_bytes: int = COLLECT_MAX_BYTES, max_files: int = COLLECT_MAX_FILES,
             max_entries: int = COLLECT_MAX_ENTRIES, max_depth: int = COLLECT_MAX_DEPTH,
             timeout_s: float = COLLECT_TIMEOUT_S) -> Pulled:
    """Pull the selected files of every host's run_dir into dest/<host>, all hosts at once, with
    the listing of the others. Each host brings at most ``max_bytes`` of file data in ``max_files``
    files and ``max_entries`` files and folders, ``max_depth`` folders deep, within ``timeout_s``;
    a name that is not text (control characters, bytes that are not UTF-8) is never stored."""
    nodes = {n.name: n for n in cluster.nodes}
    caps = Caps(max_bytes, max_files, max_entries, max_depth, timeout_s)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        futures = {h: pool.submit(_pull, nodes[h], run_dir, dest / h, user=cluster.user, selection=selection,
                                  caps=caps, people=cluster.has_people) for h in hosts}
    out = Pulled()
    for h, f in futures.items():
        node = f.result()
        if node.error is not None:
            out.errors[h] = node.error
        if node.left.files:
            out.left[h] = node.left
        out.brought[h] = (node.files, node.bytes)
    return out


