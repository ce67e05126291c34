"""Bring a run's files home: one tar stream per node, all nodes at once.

The collect playbook fetched file by file (a round trip each, about 2 s for a small run); a tar
over the same ssh the runner already uses to follow the run costs one connection per node. A
node that cannot be reached this way falls back to the playbook, so nothing is lost silently.
"""

from __future__ import annotations

import shlex
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import UserError
from .inventory import Cluster, Node
from .remote import shell_argv

COLLECT_TIMEOUT_S = 600
# Prefix of the error of a node ssh could not reach: another way in (the playbook) would wait
# for the same connect timeout, so such a node is reported, not retried.
UNREACHABLE = "unreachable: "


def collect_hosts(cluster: Cluster, rank_hosts: list[str]) -> list[str]:
    """Hosts holding files of the run: on a shared folder the head holds everyone's."""
    mode = str(cluster.group_vars.get("distrun_shared_fs_mode", "sync"))
    if mode == "sync":
        return list(dict.fromkeys([cluster.head.name, *rank_hosts]))
    return [cluster.head.name]


def _safe(member: tarfile.TarInfo) -> bool:
    """Only plain files and folders inside the destination: a node's run dir is not trusted
    to write elsewhere on this machine (no absolute paths, '..', links or devices)."""
    path = Path(member.name)
    if path.is_absolute() or ".." in path.parts:
        return False
    return member.isfile() or member.isdir()


def _pull(node: Node, run_dir: str, dest: Path) -> str | None:
    """Unpack node's run_dir into dest; None on success, else why it failed."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    command = f"tar -C {shlex.quote(run_dir)} -czf - ."
    try:
        proc = subprocess.Popen(shell_argv(node, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, UserError) as exc:
        return str(exc)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|gz") as tar:
            for member in tar:
                if _safe(member):
                    tar.extract(member, dest, set_attrs=False)
    except (tarfile.TarError, OSError, EOFError) as exc:
        proc.kill()
        proc.wait()
        return f"unpacking failed: {exc}"
    try:
        rc = proc.wait(timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "timed out"
    if rc != 0:
        err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
        why = err[-1] if err else f"exit {rc}"
        return f"{UNREACHABLE}{why}" if rc == 255 and node.connection != "local" else why
    return None


def pull_run(cluster: Cluster, run_dir: str, hosts: list[str], dest: Path) -> dict[str, str]:
    """Pull every host's copy of run_dir into dest/<host>; host -> error for those that failed."""
    nodes = {n.name: n for n in cluster.nodes}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        futures = {h: pool.submit(_pull, nodes[h], run_dir, dest / h) for h in hosts}
    return {h: err for h, f in futures.items() if (err := f.result()) is not None}
