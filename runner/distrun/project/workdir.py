"""The user's project folder (``--workdir``) on the nodes: where it lives there, which of its
files go (the project's ``.gitignore`` and ``.distrunignore``), the rsync commands that send it,
and what rsync reported.

The controller sends the folder to the head once (its uplink is used once, incrementally);
in sync mode every other rank host then pulls the head's copy over the cluster's own ssh mesh.
Both hops run as the training user, so the copy is that user's and root never writes into a
folder a job could have filled with links.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Node
from distrun.project.ignore_rules import IgnoreRule, parse_ignore
from distrun.transport.remote import run_ssh

IGNORE_FILES = (".gitignore", ".distrunignore")  # the later file of a folder wins over the earlier
ENV_FILE = ".distrun_env"
# Never sent, whatever the ignore files say: git's own folder (size, history), Python's bytecode
# caches (each node's Python writes its own), and the env file, whose values may be secrets and
# reach the ranks only through the run's 0600 env.sh.
NEVER_SENT = ("- .git", "- __pycache__/", f"- /{ENV_FILE}")
# Above either, the run warns with the size before the first sync sends it all.
WARN_BYTES = 100 << 20
WARN_FILES = 20_000
# Others may not read a project on the nodes (its code, its data), as they may not read a run.
CHMOD = "go-w,o-rwx"


@dataclass(frozen=True)
class Scan:
    """What a sync sends: the files the ignore rules keep, and their size."""

    files: int
    bytes: int
    ignore_files: tuple[str, ...]  # the ignore files read, relative to the workdir

    @property
    def large(self) -> bool:
        return self.bytes > WARN_BYTES or self.files > WARN_FILES


def _never_sent(path: str, is_dir: bool) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name == ".git" or (is_dir and name == "__pycache__") or path == ENV_FILE


def read_rules(root: Path, kept: list[str] | None = None) -> tuple[list[IgnoreRule], Scan]:
    """Every rule of every ignore file in the folder, shallow folders first, and the scan
    (``kept``, when given, receives the path of every file a sync sends).

    Folders the rules leave out are not entered (their ignore files do not count, as in git).
    """
    rules: list[IgnoreRule] = []
    found: list[str] = []
    files = size = 0

    def ignored(path: str, is_dir: bool) -> bool:
        if _never_sent(path, is_dir):
            return True
        verdict = False
        for rule in rules:
            if rule.matches(path, is_dir):
                verdict = not rule.negate
        return verdict

    # Breadth first: every folder's ignore files are read before any deeper path is judged.
    level = [""]
    while level:
        below: list[str] = []
        for rel in level:
            folder = root / rel if rel else root
            for name in IGNORE_FILES:
                f = folder / name
                if f.is_file() and not f.is_symlink():
                    rules.extend(parse_ignore(f.read_text(errors="replace"), rel))
                    found.append(f"{rel}/{name}" if rel else name)
        for rel in level:
            folder = root / rel if rel else root
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                raise UserError(f"--workdir {root}: cannot read {folder}: {exc.strerror}") from None
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if ignored(path, is_dir):
                    continue
                if is_dir:
                    below.append(path)
                else:
                    files += 1
                    if kept is not None:
                        kept.append(path)
                    size += entry.stat(follow_symlinks=False).st_size if not entry.is_symlink() else 0
        level = below
    return rules, Scan(files, size, tuple(found))


def rsync_filters(rules: list[IgnoreRule]) -> list[str]:
    """``--filter`` arguments for rules read by read_rules: the fixed exclusions first, then
    the ignore files' rules last line first (git: the last match wins; rsync: the first)."""
    out = list(NEVER_SENT)
    for rule in reversed(rules):
        out += rule.rsync_rules()
    return [f"--filter={r}" for r in out]


def node_path(shared_dir: str, local: Path) -> str:
    """Where a project lives on the nodes: one folder per project folder and controller, so a
    second run finds the first's copy and sends only what changed."""
    resolved = local.resolve()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", resolved.name).strip("-.") or "project"
    key = hashlib.sha256(f"{socket.gethostname()}:{resolved}".encode()).hexdigest()[:8]
    return f"{shared_dir.rstrip('/')}/workdirs/{slug[:40]}-{key}"


def _as_user_script(user: str, target: str) -> str:
    """rsync's remote side: make the folder and run rsync as the training user, whoever logs in."""
    return (
        f"u={shlex.quote(user)}; d={shlex.quote(target)}; "
        'run() { if [ "$(id -un)" = "$u" ]; then "$@"; elif [ "$(id -u)" = 0 ]; then runuser -u "$u" -- "$@"; '
        'else sudo -n -u "$u" -- "$@"; fi; }; '
        'run mkdir -p -- "$d" && run rsync "$@"'
    )


def _rsh_quote(words: list[str]) -> str:
    """A command for rsync's --rsh: rsync splits it on spaces and honours double quotes only."""
    return " ".join('"' + w.replace('"', '""') + '"' if (" " in w or '"' in w or not w) else w for w in words)


# For a node reached with ansible_connection=local: rsync's "remote" command runs here, read by
# sh exactly as a login shell over ssh would read it.
LOCAL_RSH = ["sh", "-c", 'shift; exec sh -c "$*"', "sh"]


def push_argv(node: Node, user: str, local: Path, target: str, filters: list[str]) -> list[str]:
    """The controller's rsync of the project folder to ``target`` on ``node`` (the head)."""
    from distrun.transport.remote import shell_argv

    if node.connection == "local":
        rsh, dest = LOCAL_RSH, f"localhost:{target}/"
    else:
        ssh = shell_argv(node, "true")  # its options, then "--", the login, the command
        sep = ssh.index("--")
        login, at, host = ssh[sep + 1].rpartition("@")
        rsh, dest = ssh[:sep], f"{login}{at}{f'[{host}]' if ':' in host else host}:{target}/"
    script = _as_user_script(user, target)
    return [
        "rsync", "--recursive", "--links", "--perms", "--times", "--omit-dir-times", "--compress",
        "--delete", "--stats", "--itemize-changes", f"--chmod={CHMOD}",
        f"--rsh={_rsh_quote(rsh)}", f"--rsync-path=sh -c {shlex.quote(script)} distrun-rsync",
        *filters, f"{local.resolve()}/", dest,
    ]


def pull_argv(head: str, target: str, filters: list[str], key: str) -> list[str]:
    """A rank host's rsync of the head's copy (sync mode), run there as the training user over
    the ssh mesh, logged in with the attempt's certificate (``key``: remote.run_ssh). Everything
    the head holds comes, what a prepare step wrote included (but never
    what NEVER_SENT names); what the ignore files match is never deleted on the node (its own
    outputs)."""
    fixed = {f"--filter={r}" for r in NEVER_SENT}
    protect = [r if r in fixed else f"--filter={'R' if r.startswith('--filter=+') else 'P'} {r.split(' ', 1)[1]}"
               for r in filters if r.startswith(("--filter=+", "--filter=-"))]
    return [
        "rsync", "--recursive", "--links", "--perms", "--times", "--omit-dir-times", "--delete", "--mkpath",
        "--stats", "--itemize-changes", f"--chmod={CHMOD}", f"--rsh={shlex.join(run_ssh(key))}",
        *protect, f"{head}:{target}/", f"{target}/",
    ]


@dataclass
class SyncStats:
    """What one rsync reported."""

    files_transferred: int = 0
    deleted: int = 0
    total_size: int = 0
    transferred_size: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    changed: list[str] = field(default_factory=list)  # files sent, as rsync itemized them
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


_STATS = {
    "files_transferred": r"Number of (?:regular )?files transferred: ([\d,.]+)",
    "deleted": r"Number of deleted files: ([\d,.]+)",
    "total_size": r"Total file size: ([\d,.]+)",
    "transferred_size": r"Total transferred file size: ([\d,.]+)",
    "bytes_sent": r"Total bytes sent: ([\d,.]+)",
    "bytes_received": r"Total bytes received: ([\d,.]+)",
}
_ITEM = re.compile(r"^([<>ch.])([fdLDS])\S* (.+)$")
_DELETING = re.compile(r"^\*deleting\s+(.+)$")


def parse_stats(text: str) -> SyncStats:
    stats = SyncStats()
    for key, pattern in _STATS.items():
        m = re.search(pattern, text)
        if m:
            setattr(stats, key, int(re.sub(r"[,.]", "", m.group(1))))
    for line in text.splitlines():
        m = _ITEM.match(line)
        if m and m.group(1) in "<>" and m.group(2) == "f":
            stats.changed.append(m.group(3))
        d = _DELETING.match(line)
        if d:
            stats.removed.append(d.group(1))
    return stats


def push(node: Node, user: str, local: Path, target: str, filters: list[str]) -> SyncStats:
    """Send the project folder to the head; what rsync reported. One line on failure."""
    if shutil.which("rsync") is None:
        raise UserError("--workdir needs rsync on this machine (the controller): install it (apt-get install rsync)")
    started = time.monotonic()
    proc = subprocess.run(push_argv(node, user, local, target, filters), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if not ln.startswith("rsync error:")), lines[-1] if lines else "no output")
        raise UserError(f"--workdir {local}: rsync to {node.name}:{target} failed (exit {proc.returncode}): {why}",
                        exit_code=ExitCode.STAGING)
    stats = parse_stats(proc.stdout)
    stats.seconds = round(time.monotonic() - started, 3)
    return stats
