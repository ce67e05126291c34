#!/usr/bin/python
"""Ansible module of role shared_fs: the sync mode's copy of the head's shared folder to the
other nodes, with the training user's rights on both ends and no process of that user's.

``pack`` runs on the head, ``unpack`` on every other node; Ansible carries the archive between them
(the controller is the only connection between nodes that needs no login as the training user).
Both run as root and switch only their filesystem identity to the user's (role distrun's
module_utils/distrun_fsuser.py): the kernel checks every path as that user's, a link in the folder
is copied as a link and never followed, what is made is the user's, and nothing a job of that
user can trace or feed answers for setup. What they say is the kernel's answer to their own calls.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.distrun_fsuser import FsUserError, as_user_fs

DOCUMENTATION = r"""
module: distrun_user_tree
short_description: Copy a user's folder from one node to others with that user's rights only
description:
  - pack reads I(path) as I(user) (files, folders and links, never through a link) into a gzipped
    tar, less what I(excludes) names; unpack makes I(path) on another node hold the same, as I(user),
    reporting a change only for entries that differ (kind, size, time or mode, a link's target),
    and with I(delete) removes what the head does not have (excludes kept).
options:
  user: {description: The user whose rights every path is checked with and who owns what is made., type: str, required: true}
  path: {description: The folder., type: path, required: true}
  state: {description: pack (on the head) or unpack (on the others)., type: str, choices: [pack, unpack], required: true}
  excludes: {description: 'Paths from the folder''s top left alone ("/runs/": a folder, "/hostfile": a file).', type: list, elements: str, default: []}
  data: {description: What pack answered (unpack)., type: str, default: ""}
  delete: {description: Remove what the head does not have (unpack)., type: bool, default: false}
  max_mb: {description: The largest archive pack makes; more is refused in one line., type: int, default: 64}
author: distrun
"""


def excluded(rel: str, excludes: list) -> bool:
    """Whether the entry rel (relative, no leading /) is one an exclude names, or lies in one."""
    path = "/" + rel
    for e in excludes:
        e = e if e.startswith("/") else "/" + e
        if e.endswith("/"):
            if path == e[:-1] or path.startswith(e):
                return True
        elif path == e or path.startswith(e + "/"):
            return True
    return False


def walk(top: str, excludes: list):
    """(rel, lstat) of every entry below top, folders before what they hold, never through a link."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(top, rel) if rel else top) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                child = f"{rel}/{e.name}" if rel else e.name
                if excluded(child, excludes):
                    continue
                st = os.lstat(os.path.join(top, child))
                yield child, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(child)


def pack(top: str, excludes: list, max_bytes: int) -> dict:
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in walk(top, excludes):
            info = tarfile.TarInfo(rel)
            info.mode, info.mtime = stat.S_IMODE(st.st_mode) & 0o7777 & ~0o6000, int(st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(os.path.join(top, rel))
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(os.path.join(top, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as fh:
                    data = fh.read(st.st_size + 1)[:st.st_size]
                total += len(data)
                if total > max_bytes:
                    return {"failed": f"{top} holds more than {max_bytes >> 20} MiB outside the excluded folders: "
                                      "sync mode copies the folder through setup; keep data elsewhere (nfs, external) "
                                      "or raise shared_fs_sync_max_mb"}
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return {"data": base64.b64encode(buf.getvalue()).decode(), "bytes": total}


def _same(path: str, m: tarfile.TarInfo) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if m.isdir():
        return stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == m.mode
    if m.issym():
        return stat.S_ISLNK(st.st_mode) and os.readlink(path) == m.linkname
    return (stat.S_ISREG(st.st_mode) and st.st_size == m.size and int(st.st_mtime) == m.mtime
            and stat.S_IMODE(st.st_mode) == m.mode)


def _clear(path: str) -> None:
    """What stands at path (not a folder of the right kind) removed: a file, a link, a folder tree."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)


def unpack(top: str, data: str, excludes: list, delete: bool, check: bool) -> dict:
    changed: list = []
    wanted: set = set()
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as tar:
        for m in tar:
            parts = [p for p in m.name.split("/") if p not in ("", ".")]
            if not parts or ".." in parts or m.name.startswith("/") or excluded("/".join(parts), excludes):
                continue
            rel = "/".join(parts)
            wanted.add(rel)
            path = os.path.join(top, rel)
            if _same(path, m) or not (m.isdir() or m.issym() or m.isfile()):
                continue
            changed.append(rel)
            if check:
                continue
            if m.isdir():
                if not (os.path.isdir(path) and not os.path.islink(path)):
                    _clear(path)
                    os.mkdir(path, 0o700)
                os.chmod(path, m.mode)
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                _clear(path)
            fd, tmp = tempfile.mkstemp(prefix=".distrun-", dir=os.path.dirname(path))
            os.close(fd)
            os.unlink(tmp)
            if m.issym():
                os.symlink(m.linkname, tmp)
            else:
                src = tar.extractfile(m)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(src.read() if src else b"")
                    os.fchmod(fh.fileno(), m.mode)
                os.utime(tmp, (m.mtime, m.mtime))
            os.rename(tmp, path)  # a link at path is replaced, never followed
    if delete:
        for rel, st in sorted(walk(top, excludes), key=lambda e: -e[0].count("/")):
            if rel not in wanted:
                changed.append(f"-{rel}")
                if not check:
                    _clear(os.path.join(top, rel))
    return {"changed": bool(changed), "entries": changed[:200]}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"user": {"type": "str", "required": True}, "path": {"type": "path", "required": True},
                       "state": {"type": "str", "choices": ["pack", "unpack"], "required": True},
                       "excludes": {"type": "list", "elements": "str", "default": []},
                       "data": {"type": "str", "default": ""}, "delete": {"type": "bool", "default": False},
                       "max_mb": {"type": "int", "default": 64}},
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "pack":
            said = as_user_fs(p["user"], pack, p["path"], list(p["excludes"]), int(p["max_mb"]) << 20)
            if "failed" not in said:
                said["changed"] = False
        else:
            said = as_user_fs(p["user"], unpack, p["path"], p["data"], list(p["excludes"]), p["delete"], module.check_mode)
    except FsUserError as exc:
        module.fail_json(msg=f"cannot {p['state']} {p['path']} as {p['user']}: {exc}; check the owner and mode of "
                             "the shared folder, then run distrun setup again")
    if "failed" in said:
        module.fail_json(msg=said["failed"])
    module.exit_json(**said)


if __name__ == "__main__":
    main()
