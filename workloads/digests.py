"""SHA-256 of files, memoised by what a change to the file would change: device, inode, size,
modification and status-change time.

Hashing Reddit's two files (about 1.6 GB) or a 114M-edge partition takes seconds; the memo makes
the second look at an unchanged file a single ``stat``. Any write to a file moves its mtime and
ctime (ctime cannot be set back by the file's owner), so a changed file is hashed again. The
memo is a small JSON file in the user's cache folder; if it cannot be read or written the
digests are simply computed. Imports only the standard library, so a caller that finds its
answer here never pays for importing numpy.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MEMO_LIMIT = 4096  # entries kept; the oldest are dropped first


def memo_path() -> Path:
    if os.environ.get("DISTRUN_CACHE_DIR"):
        root = Path(os.environ["DISTRUN_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "distrun"
    else:
        root = Path.home() / ".cache" / "distrun"
    return root / "file-digests.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class DigestMemo:
    """Digests of files keyed by absolute path, valid while the file's stamp is unchanged."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or memo_path()
        self._entries: dict[str, list] | None = None
        self._dirty = False

    def _load(self) -> dict[str, list]:
        if self._entries is None:
            try:
                data = json.loads(self.path.read_text())
                self._entries = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def sha256(self, path: Path) -> str:
        """The file's digest; raises OSError when it cannot be read."""
        path = Path(os.path.abspath(path))
        stamp = _stamp(path.stat())
        entry = self._load().get(str(path))
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stamp:
            return str(entry[1])
        digest = sha256_file(path)
        self.remember(path, digest, stamp)
        return digest

    def remember(self, path: Path, digest: str, stamp: list[int] | None = None) -> None:
        """Record a digest computed elsewhere (a writer that hashed the bytes as it wrote them)."""
        path = Path(os.path.abspath(path))
        entries = self._load()
        entries.pop(str(path), None)  # re-insert so the newest entries are the last ones
        entries[str(path)] = [stamp or _stamp(path.stat()), digest]
        self._dirty = True

    def save(self) -> None:
        if not self._dirty or self._entries is None:
            return
        entries = self._entries
        if len(entries) > MEMO_LIMIT:
            entries = dict(list(entries.items())[-MEMO_LIMIT:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(entries))
            tmp.replace(self.path)
            self._dirty = False
        except OSError:
            pass  # a memo that cannot be written only costs a re-hash next time
