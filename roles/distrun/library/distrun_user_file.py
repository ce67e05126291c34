#!/usr/bin/python
"""Ansible module of role distrun: files of a user, as that user.

For the paths a user's jobs can write (the training user's home, the shared folder): a file
written whole (its text given inline, or a managed block at its top), a folder made, a file
removed, or a path looked at. The module runs as root and switches only its filesystem identity
to the user's (module_utils/distrun_fsuser.py): it stays a root process no job of that user can
trace, signal or answer for, while the kernel checks every path component and file as that user,
so a link a job planted reaches nothing the user could not reach anyway, and what it creates is
the user's. Its answer is the kernel's answer to its own calls: nothing a process of the user's
printed, and no facts. The text arrives inline, on the module's stdin (pipelining): no file
passes through a temporary folder handed to the user. A link at a file's place is replaced, never
followed: the text goes to a new file in the same folder (``O_EXCL``), renamed over it.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.distrun_fsuser import FsUserError, as_user_fs

DOCUMENTATION = r"""
module: distrun_user_file
short_description: A user's file or folder, written, made, removed or looked at as that user
description:
  - Run as root, switches only its filesystem identity to I(user) (setfsuid, setfsgid and the
    user's groups) and then acts on I(path) with that user's rights alone. Reports a change only
    when the file's text or mode, or the folder's mode, differ, or a link or another kind of file
    stood at the path.
options:
  user: {description: The user whose rights every path is checked with and who owns what is made., type: str, required: true}
  path: {description: The file or folder., type: path, required: true}
  state:
    description: file (written whole), directory (made), absent (a file removed), look (exists, kind, writable by the user, a file's text).
    type: str
    choices: [file, directory, absent, look]
    default: file
  content: {description: 'The file''s whole text (state file).', type: str}
  block: {description: 'Text kept between two marker lines at the top of the file, the rest of it kept as it is (state file, instead of content).', type: str}
  marker: {description: 'The marker lines'' text, "{mark}" replaced by BEGIN and END (with block).', type: str}
  mode: {description: The file's or folder's mode (octal string)., type: str}
author: distrun
"""

LOOK_MAX = 64 << 10  # a file looked at: at most this much of its text


def current(path: str) -> tuple[bytes, int] | None:
    """path's bytes and permission bits when it is a plain file; None otherwise (a link included)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
            return None
        return fh.read(), stat.S_IMODE(st.st_mode)


def write(path: str, data: bytes, mode: int) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".distrun-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)  # replaces a link at path itself, never writes where it points
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def with_block(text: str, block: str, marker: str) -> str:
    """text with block between its two marker lines: in place where they are, else at the top."""
    begin, end = marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")
    body = block if block.endswith("\n") or not block else block + "\n"
    managed = f"{begin}\n{body}{end}\n"
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == begin]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == end]
    if starts and ends and ends[-1] > starts[0]:
        return "".join(lines[:starts[0]]) + managed + "".join(lines[ends[-1] + 1:])
    return managed + text


def look(path: str) -> dict:
    try:
        st = os.lstat(path)
    except OSError:
        return {"exists": False, "kind": "", "writable": False, "content": ""}
    kind = ("link" if stat.S_ISLNK(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode)
            else "file" if stat.S_ISREG(st.st_mode) else "other")
    need = os.W_OK | os.X_OK if kind == "directory" else os.W_OK
    content = ""
    if kind == "file":
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                content = fh.read(LOOK_MAX).decode(errors="replace")
        except OSError:
            content = ""
    return {"exists": True, "kind": kind, "writable": kind in ("file", "directory") and os.access(
        path, need, effective_ids=os.access in os.supports_effective_ids), "content": content}


def run(p: dict, check_mode: bool) -> dict:
    """What the module does, in the child that took the user's filesystem identity."""
    path, state = p["path"], p["state"]
    if state == "look":
        return {"changed": False, **look(path)}
    if state == "absent":
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return {"changed": False}
        if stat.S_ISDIR(st.st_mode):
            return {"failed": f"{path} is a folder: distrun removes only files there"}
        if not check_mode:
            os.unlink(path)
        return {"changed": True}
    mode = int(p["mode"], 8) if p["mode"] else None
    if state == "directory":
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not check_mode:
                os.mkdir(path, 0o700)
                os.chmod(path, 0o755 if mode is None else mode)
            return {"changed": True}
        if not stat.S_ISDIR(st.st_mode):
            return {"failed": f"{path} is not a folder (a link or a file): remove it and run distrun setup again"}
        if mode is not None and stat.S_IMODE(st.st_mode) != mode:
            if not check_mode:
                os.chmod(path, mode)
            return {"changed": True}
        return {"changed": False}
    have = current(path)
    if p["block"] is not None:
        text = with_block(have[0].decode(errors="surrogateescape") if have else "", p["block"], p["marker"])
        data = text.encode(errors="surrogateescape")
    else:
        data = p["content"].encode()
    mode = (have[1] if have else 0o644) if mode is None else mode
    if have == (data, mode):
        return {"changed": False}
    if not check_mode:
        write(path, data, mode)
    return {"changed": True}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"user": {"type": "str", "required": True},
                       "path": {"type": "path", "required": True},
                       "state": {"type": "str", "default": "file", "choices": ["file", "directory", "absent", "look"]},
                       "content": {"type": "str", "no_log": False},
                       "block": {"type": "str"},
                       "marker": {"type": "str"},
                       "mode": {"type": "str"}},
        mutually_exclusive=[("content", "block")],
        required_together=[("block", "marker")],
        supports_check_mode=True,
    )
    p = module.params
    if p["state"] == "file" and p["content"] is None and p["block"] is None:
        module.fail_json(msg="state file needs content or block")
    try:
        result = as_user_fs(p["user"], run, dict(p), module.check_mode)
    except FsUserError as exc:
        module.fail_json(msg=f"cannot {p['state'] if p['state'] != 'file' else 'write'} {p['path']} as "
                             f"{p['user']}: {exc}; check the owner and mode of it and its folders, "
                             "then run distrun setup again")
    if result.get("failed"):
        module.fail_json(msg=result["failed"])
    module.exit_json(path=p["path"], **result)


if __name__ == "__main__":
    main()
