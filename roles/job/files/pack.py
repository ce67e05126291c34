"""distrun's node program that packs a run's files for collect and 'distrun fetch': one stream,
the listing of the files that stay, then a tar of those that travel.

``python3 -I -c <nodecommon.py + distrun_fsuser.py + this file> pack '<config JSON>'``. Run as
root (where the connection can be root), it first takes the training user's filesystem identity
(``user``): it reads what that user could read and nothing else (a link is never followed, not
even a folder's), and no process of that user's, which a job could trace and make send anything,
packs the run. Standard library only; Python 3.9 or newer.

The config: ``run_dir`` (refused, exit 3 with one line, when it or its runs folder is a link or it
is not where it should be once every link above it is resolved), ``patterns`` (a regular
expression over ``./``-prefixed paths: what travels), ``small`` (the size up to which any file
travels; -1: none), ``listed`` (list what stays), ``gzip``, and the caps, which the node keeps
itself so a job's files cost neither the node's time nor the controller's inodes:
``max_files`` (files that travel), ``max_entries`` (those files and the folders they need),
``max_depth`` (folders below the run dir: nothing deeper is walked, packed or listed), ``list_max``.
A name that is not UTF-8 text, or holds a control character, is never packed: it stays, listed
with its bytes escaped. The stream stops one file or one entry past a cap, so the controller sees
that it was hit. On stdout: ``size<TAB>path<NUL>`` per file that stays, one more NUL, the tar.
"""

import json
import os
import re
import stat
import sys
import tarfile

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): the head and the switch of identity
    _HERE = os.path.dirname(os.path.abspath(__file__))
    for _part in (f"{_HERE}/nodecommon.py", f"{_HERE}/../../distrun/module_utils/distrun_fsuser.py"):
        with open(_part, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _part, "exec"))  # the same one namespace as the composed source on a node

REFUSED_RC = 3  # the run dir is a link or not where it should be (the runner's collect.py knows it)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Refused(Exception):
    """The run dir cannot be packed, in one line."""


def plain_text(name: bytes) -> "str | None":
    """The name as text when it is UTF-8 without control characters, else None."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _CONTROL.search(text) else text


def shown(rel: bytes) -> str:
    """A path for the listing: its text, each byte that is not plain printable UTF-8 as \\xNN."""
    out = []
    for part in rel.split(b"/"):
        text = plain_text(part)
        out.append(text if text is not None else "".join(
            chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in part))
    return "/".join(out)


def check_run_dir(run_dir: str) -> None:
    runs = os.path.dirname(run_dir.rstrip("/"))
    name = os.path.basename(run_dir.rstrip("/"))
    try:
        st, rst = os.lstat(run_dir), os.lstat(runs)
    except OSError as exc:
        raise Refused(f"{run_dir} is a link or not a folder inside {runs} ({exc.strerror})") from None
    if (stat.S_ISLNK(st.st_mode) or stat.S_ISLNK(rst.st_mode) or not stat.S_ISDIR(st.st_mode)
            or os.path.realpath(run_dir) != os.path.join(os.path.realpath(runs), name)):
        raise Refused(f"{run_dir} is a link or not a folder inside {runs}")


def walk(top: str, max_depth: int):
    """(relative path bytes, lstat, depth) of every regular file below top on its filesystem, no
    link followed, down to max_depth folders: nothing deeper is walked (a job's folder chains cost
    the node no time)."""
    base = os.fsencode(top)
    dev = os.lstat(top).st_dev
    stack = [(b"", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(base, rel) if rel else base) as entries:
                items = sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            if not rel:  # the run directory itself: nothing of it can travel, and the node says why
                raise Refused(f"the run directory {top} is not readable as its user ({exc.strerror})") from None
            continue
        for e in items:
            path = rel + b"/" + e.name if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_dev == dev and depth < max_depth:
                stack.append((path, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                yield path, st, depth


def pack(cfg: dict, out) -> None:
    run_dir = cfg["run_dir"]
    check_run_dir(run_dir)
    chosen = re.compile(cfg.get("patterns") or r"(?!)")
    never = re.compile(cfg.get("never") or r"(?!)")  # neither travels nor is listed (an attempt's key)
    small, listed = int(cfg.get("small", -1)), bool(cfg.get("listed"))
    max_files, max_entries = int(cfg["max_files"]), int(cfg["max_entries"])
    max_depth, list_max = int(cfg["max_depth"]), int(cfg.get("list_max", 10000))
    files = list(walk(run_dir, max_depth))
    travel, stays = [], []
    for rel, st, depth in files:
        text = plain_text(rel) if b"\0" not in rel else None
        path = "./" + (text if text is not None else shown(rel))
        if never.fullmatch(path):
            continue
        if text is not None and (chosen.fullmatch(path) or 0 <= st.st_size <= small):
            travel.append((rel, text))
        else:
            stays.append((st.st_size, shown(rel)))
    if listed:
        for size, path in stays[:list_max + 1]:
            out.write(f"{size}\t{path}".encode("utf-8", "replace") + b"\0")
    out.write(b"\0")
    out.flush()
    folders: set = set()
    sent = 0
    with tarfile.open(fileobj=out, mode="w|gz" if cfg.get("gzip") else "w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, text in travel:
            try:
                fd = os.open(os.path.join(os.fsencode(run_dir), rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode):
                    continue
                info = tarfile.TarInfo(text)
                info.size, info.mode, info.mtime = st.st_size, stat.S_IMODE(st.st_mode) & 0o755, int(st.st_mtime)
                tar.addfile(info, _Exactly(fh, st.st_size))
            sent += 1
            folders |= {text.rsplit("/", k)[0] for k in range(1, text.count("/") + 1)}
            if sent > max_files or sent + len(folders) > max_entries:
                break  # one past a cap: the controller sees it was hit


class _Exactly:
    """A file read as exactly size bytes (a file that grows or shrinks while packed keeps the tar whole)."""

    def __init__(self, fh, size: int) -> None:
        self.fh, self.left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        return data


def main(argv: list) -> int:
    if len(argv) != 2 or argv[0] != "pack":
        print(f"pack.py: usage: pack.py pack '<config JSON>' (got {' '.join(argv[:1]) or 'nothing'})", file=sys.stderr)
        return 2
    try:
        cfg = json.loads(argv[1])
        for key in ("run_dir", "max_files", "max_entries", "max_depth"):
            cfg[key]  # noqa: B018 - a missing key is a bad call
        if not plain_name(cfg.get("user")) or not os.path.isabs(str(cfg["run_dir"])):
            raise ValueError("user or run_dir")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"pack.py: a bad config: {exc}", file=sys.stderr)
        return 2
    try:
        if os.geteuid() == 0:
            become(cfg["user"])  # noqa: F821 - distrun_fsuser.py, sent in front of this program
        pack(cfg, sys.stdout.buffer)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return REFUSED_RC
    except (OSError, FsUserError) as exc:  # noqa: F821
        print(f"pack.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
