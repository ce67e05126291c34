"""Bring a run's files home: one tar stream per node, all nodes at once.

The collect playbook fetched file by file (a round trip each, about 2 s for a small run); a tar
over the same ssh the runner already uses to follow the run costs one connection per node. A
node that cannot be reached this way falls back to the playbook, so nothing is lost silently.
"""

from __future__ import annotations

import getpass
import shlex
import subprocess
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import UserError
from .inventory import Cluster, Node
from .remote import shell_argv

COLLECT_TIMEOUT_S = 600
COLLECT_MAX_BYTES = 2 << 30
# Prefixes of a node's error that another way in (the playbook) would not fix: a node ssh
# could not reach (the playbook would wait for the same connect timeout), a run dir refused
# as unsafe, a run dir over the cap or a pull over its time. Such a node is reported, not retried.
UNREACHABLE = "unreachable: "
REFUSED = "refused: "
CAPPED = "capped: "
FINAL = (UNREACHABLE, REFUSED, CAPPED)
_REFUSED_EXIT = 3


def collect_hosts(cluster: Cluster, rank_hosts: list[str]) -> list[str]:
    """Hosts holding files of the run: on a shared folder the head holds everyone's."""
    mode = str(cluster.group_vars.get("distrun_shared_fs_mode", "sync"))
    if mode == "sync":
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


def tar_command(run_dir: str, user: str, as_user: bool) -> str:
    """The node-side command: refuse a run dir that is a link, whose runs folder is a link, or
    that is not where it should be once every link above it is resolved (a job may replace its
    run dir or the runs folder), then stream it. It runs as the training user (``as_user``:
    through sudo), so it reads nothing that user could not read anyway."""
    runs_dir = run_dir.rstrip("/").rsplit("/", 1)[0]
    script = (
        f"d={shlex.quote(run_dir)}; r={shlex.quote(runs_dir)}; "
        'name="${d##*/}"; '
        'if [ -L "$d" ] || [ -L "$r" ] || [ ! -d "$d" ] || '
        '[ "$(cd -P -- "$d" 2>/dev/null && pwd)" != "$(cd -P -- "$r/.." 2>/dev/null && pwd)/${r##*/}/$name" ]; '
        f'then echo "$d is a link or not a folder inside $r" >&2; exit {_REFUSED_EXIT}; fi; '
        'cd -P -- "$d" && exec tar --one-file-system -czf - .'
    )
    if not as_user:
        return script
    return f"sudo -n -u {shlex.quote(user)} -- bash -c {shlex.quote(script)}"


def _runs_as(node: Node, user: str) -> bool:
    """Whether the shell ``shell_argv`` opens on node is already the training user's."""
    if node.connection == "local":
        return getpass.getuser() == user
    hv = node.hostvars
    return str(hv.get("ansible_user") or hv.get("ansible_ssh_user") or getpass.getuser()) == user


def _pull(node: Node, run_dir: str, dest: Path, *, user: str, max_bytes: int, timeout_s: float) -> str | None:
    """Unpack node's run_dir into dest; None on success, else why it failed."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    command = tar_command(run_dir, user, as_user=not _runs_as(node, user))
    try:
        proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, UserError) as exc:
        return str(exc)
    assert proc.stdout is not None
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, expire)
    timer.start()
    total = files = 0
    capped = False
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|gz") as tar:
            for member in tar:
                if not _safe(member):
                    continue
                if member.isfile():
                    if total + member.size > max_bytes:
                        capped = True
                        break
                    total += member.size
                    files += 1
                tar.extract(member, dest, set_attrs=False, **_DATA_FILTER)
    except (tarfile.TarError, OSError, EOFError) as exc:
        if not timed_out.is_set():
            try:
                proc.wait(timeout=5)  # an empty stream: the node's command ended (a refusal?)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode == _REFUSED_EXIT:
                return REFUSED + _last_line(proc)
            return f"unpacking failed: {exc}"
    finally:
        timer.cancel()
    if capped:
        proc.kill()
        proc.wait()
        return (f"{CAPPED}stopped at the cap of {_size(max_bytes)} after {files} file(s) ({_size(total)}); "
                f"the rest stays in {run_dir} on {node.name} (raise DISTRUN_COLLECT_MAX_MB to bring more)")
    if timed_out.is_set():
        proc.wait()
        return (f"{CAPPED}stopped after {timeout_s:.0f}s with {files} file(s) ({_size(total)}); "
                f"the rest stays in {run_dir} on {node.name} (raise DISTRUN_COLLECT_TIMEOUT_S to wait longer)")
    rc = proc.wait()
    if rc == _REFUSED_EXIT:
        return REFUSED + _last_line(proc)
    if rc != 0:
        why = _last_line(proc) or f"exit {rc}"
        return f"{UNREACHABLE}{why}" if rc == 255 and node.connection != "local" else why
    return None


def _last_line(proc: subprocess.Popen) -> str:
    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
    return err[-1] if err else ""


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def pull_run(cluster: Cluster, run_dir: str, hosts: list[str], dest: Path, *,
             max_bytes: int = COLLECT_MAX_BYTES, timeout_s: float = COLLECT_TIMEOUT_S) -> dict[str, str]:
    """Pull every host's copy of run_dir into dest/<host>; host -> error for those that failed.
    Each host brings at most ``max_bytes`` of file data within ``timeout_s``."""
    nodes = {n.name: n for n in cluster.nodes}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        futures = {h: pool.submit(_pull, nodes[h], run_dir, dest / h, user=cluster.user, max_bytes=max_bytes,
                                  timeout_s=timeout_s) for h in hosts}
    return {h: err for h, f in futures.items() if (err := f.result()) is not None}
