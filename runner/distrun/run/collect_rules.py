"""Which files of a run dir come home, and the listing of those that stay on the nodes.

Only what tells how the run went travels when it ends: every file distrun writes for an attempt
(launcher logs, exit codes, the ranks' logs, also those of attempts put aside), log files, and
any other file of at most SMALL_BYTES (results, metrics, the files distrun staged). Anything
bigger the job wrote into its run directory (checkpoints, outputs) stays on the node and is
listed with its size in the record (LEFT_FILE); 'distrun fetch RUN PATH' brings it on request.
So a run with gigabytes of checkpoints ends as fast as one without, and the controller's disk
does not fill with them.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from distrun.launchers import LAUNCHERS
from distrun.transport.rundir import ATTEMPT_FILES, ATTEMPTS, MESH_KEY

# Files of the job's own up to this size come home with its logs; bigger ones stay, listed.
SMALL_BYTES = 1 << 20
# Logs by their name, wherever the job writes them and whatever their size.
LOG_NAMES = ("*.log", "*.out", "*.err")
# The record's file listing what stayed on each node.
LEFT_FILE = "left-on-nodes.json"
# What one node's collect may bring, and how long it may take.
COLLECT_TIMEOUT_S = 600
COLLECT_MAX_BYTES = 2 << 30
# Files per node: a job's thousands of empty files cost the controller inodes and time that
# bytes do not count. The node's packer stops one past it, so the controller sees the cap hit.
COLLECT_MAX_FILES = 10000
# Entries per node (files and the folders they need) and folders deep: a few files at the end of
# long folder chains would make the controller thousands of folders, which files do not count.
COLLECT_MAX_ENTRIES = 20000
COLLECT_MAX_DEPTH = 32
# What never leaves a node, whatever a selection says: an attempt's ssh private key (valid for
# minutes, but a key all the same: a run's record on the controller is no place for it).
NEVER = (f"{ATTEMPTS}/*/{MESH_KEY}", MESH_KEY)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def plain_name(name: str) -> bool:
    """Whether a member's name is text a terminal can show as it is: UTF-8 (tarfile keeps bytes
    that are not as surrogates) without control characters. Other names are never stored here."""
    return not _CONTROL.search(name) and not any(0xDC80 <= ord(c) <= 0xDCFF for c in name)


def size_text(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def folders_of(member: tarfile.TarInfo) -> set[str]:
    """The folders a member needs (itself too, when it is one), as relative paths."""
    parts = PurePosixPath(member.name).parts
    return {"/".join(parts[:k]) for k in range(1, len(parts) + (0 if member.isfile() else 1))}


@dataclass(frozen=True)
class Caps:
    """What one node's collect may bring: bytes of file data, files, entries (files and the
    folders they need), folders deep, seconds."""

    max_bytes: int = COLLECT_MAX_BYTES
    max_files: int = COLLECT_MAX_FILES
    max_entries: int = COLLECT_MAX_ENTRIES
    max_depth: int = COLLECT_MAX_DEPTH
    timeout_s: float = COLLECT_TIMEOUT_S

    def passed(self, member: tarfile.TarInfo, files: int, size: int, folders: set[str]) -> str:
        """The cap a member would pass after ``files`` files of ``size`` bytes in ``folders``
        ("" when none)."""
        if member.isfile() and size + member.size > self.max_bytes:
            return f"the cap of {size_text(self.max_bytes)}"
        if member.isfile() and files >= self.max_files:
            return f"the cap of {self.max_files} files"
        if len(PurePosixPath(member.name).parts) - (1 if member.isfile() else 0) > self.max_depth:
            return f"the cap of {self.max_depth} folders deep"
        if files + len(folders | folders_of(member)) + (1 if member.isfile() else 0) > self.max_entries:
            return f"the cap of {self.max_entries} files and folders"
        return ""


@dataclass
class Left:
    """Files a node keeps in its run dir: (size, path relative to the run dir); ``more`` when
    the listing stopped at collect.LIST_MAX."""

    files: list[tuple[int, str]] = field(default_factory=list)
    more: bool = False

    @property
    def size(self) -> int:
        return sum(s for s, _ in self.files)


@dataclass(frozen=True)
class Selection:
    """Which files of a run dir travel: those ``patterns`` match (find's -path, relative to the
    run dir, '*' crossing '/'), and with ``small`` every file of at most SMALL_BYTES; ``listed``:
    the others are listed; ``gzip``: the stream is compressed (logs shrink tenfold; a model or a
    checkpoint does not, and compressing a gigabyte would cost a core half a minute)."""

    patterns: tuple[str, ...]
    small: bool = False
    listed: bool = False
    gzip: bool = True
    never: tuple[str, ...] = NEVER  # neither travels nor is listed, even when a pattern names it

    def never_regex(self) -> str:
        """``never`` as one regular expression over './'-prefixed relative paths."""
        return "|".join(f"(?:{fnmatch.translate('./' + p)})" for p in self.never) or "(?!)"

    def regex(self) -> str:
        """The patterns as one regular expression over './'-prefixed relative paths (the
        collect playbook's file-by-file fallback applies the size rule itself)."""
        return "|".join(f"(?:{fnmatch.translate('./' + p)})" for p in self.patterns)


def run_end_selection() -> Selection:
    """What a run brings home when it ends: every attempt's own files (ATTEMPT_FILES and every
    launcher's, in attempts/<n>/), log files, every small file; the rest listed."""
    patterns: list[str] = []
    names = dict.fromkeys([*ATTEMPT_FILES, *(f for launcher in LAUNCHERS.values() for f in launcher.attempt_files)])
    for name in names:
        patterns += [f"{ATTEMPTS}/*/{name}", f"{ATTEMPTS}/*/{name}/*"]
    patterns += [f"*{name}" for name in LOG_NAMES]
    return Selection(tuple(patterns), small=True, listed=True)


def path_selection(paths: Sequence[str]) -> Selection:
    """What 'distrun fetch' brings: each path (a file, a folder, a glob) and what lies under it."""
    patterns: list[str] = []
    for p in paths:
        patterns += [p, f"{p}/*"]
    return Selection(tuple(patterns), gzip=False)


def left_record(run_dir: str, left: dict[str, Left]) -> str:
    """The record's LEFT_FILE: per host, the files that stayed in run_dir (path, size), biggest first."""
    hosts = {h: {"files": [{"path": p, "size": s} for s, p in sorted(entry.files, key=lambda f: (-f[0], f[1]))],
                 "more": entry.more, "bytes": entry.size}
             for h, entry in sorted(left.items())}
    return json.dumps({"run_dir": run_dir, "hosts": hosts}, indent=2) + "\n"
