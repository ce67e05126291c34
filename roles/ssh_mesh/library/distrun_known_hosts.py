#!/usr/bin/python
"""Ansible module of role ssh_mesh: every node's host keys in one known_hosts, in one call.

Runs as root. With ``user`` (the training user's ~/.ssh/known_hosts) it reads and writes the file
with that user's rights alone (role distrun's module_utils/distrun_fsuser.py: root that switched
only its filesystem identity, no process of the user's), so a link there reaches nothing the user
could not; without it, root's own file (root's store of what root's logins trust). Each entry is a whole known_hosts line (``aliases keytype key``).
The file ends up holding every entry; a line that names one of an entry's aliases with a key
type the entries manage, but is not one of the entries (a rebuilt node's old key, an old alias
list), is removed. Every other line (the user's own hosts, hashed lines, comments) stays as it is.
The file is replaced whole (a new file renamed over it), so a link put in its place is replaced,
never followed.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.distrun_fsuser import FsUserError, as_user_fs

DOCUMENTATION = r"""
module: distrun_known_hosts
short_description: Put the cluster's host keys in a known_hosts file in one call
description:
  - Adds every entry that is missing and removes lines of the same hosts and key types that are
    not entries; other lines stay. Reports changed only when the file's lines change.
options:
  path: {description: The known_hosts file., type: path, required: true}
  user: {description: 'The user whose file it is, read and written with that user''s rights; empty: root''s own.', type: str, default: ""}
  entries: {description: 'Whole known_hosts lines: "alias,alias,... keytype key".', type: list, elements: str, required: true}
author: distrun
"""


def _fields(line: str) -> tuple[set[str], str, str] | None:
    """(host names, key type, key) of a plain known_hosts line; None for comments, markers,
    hashed names and anything else this module does not manage."""
    words = line.split()
    if len(words) < 3 or words[0].startswith(("#", "@", "|")):
        return None
    return {h.lower() for h in words[0].split(",")}, words[1], words[2]


def merged(current: list[str], entries: list[str]) -> list[str]:
    """The file's new lines: the current ones without stale lines of the entries' hosts, then
    every entry not yet there."""
    wanted = [" ".join(e.split()) for e in entries]
    managed: list[tuple[set[str], str]] = []
    for entry in wanted:
        f = _fields(entry)
        if f is None:
            raise ValueError(f"not a known_hosts line: {entry!r}")
        managed.append((f[0], f[1]))
    kept = []
    for line in current:
        f = _fields(line)
        stale = (f is not None and " ".join(line.split()) not in wanted
                 and any(f[1] == kind and f[0] & names for names, kind in managed))
        if not stale:
            kept.append(line)
    have = {" ".join(line.split()) for line in kept}
    return kept + [e for e in wanted if e not in have]


def write(path: str, lines: list[str]) -> None:
    folder = os.path.dirname(path) or "."
    try:
        st = os.lstat(path)
        mode = 0o644 if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{line}\n" for line in lines))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def converge(path: str, entries: list[str], check_mode: bool) -> dict:
    """The file made to hold the entries: {"changed", "lines"}, or {"failed": why}."""
    try:
        with open(path) as fh:
            current = fh.read().splitlines()
    except FileNotFoundError:
        current = []
    try:
        lines = merged(current, entries)
    except ValueError as exc:
        return {"failed": str(exc)}
    changed = lines != current or os.path.islink(path)
    if changed and not check_mode:
        write(path, lines)
    return {"changed": changed, "lines": len(lines)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True},
                       "user": {"type": "str", "default": ""},
                       "entries": {"type": "list", "elements": "str", "required": True}},
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["user"]:
            said = as_user_fs(p["user"], converge, p["path"], list(p["entries"]), module.check_mode)
        else:
            said = converge(p["path"], list(p["entries"]), module.check_mode)
    except (FsUserError, OSError) as exc:
        module.fail_json(msg=f"cannot write {p['path']}: {getattr(exc, 'strerror', None) or exc}")
    if said.get("failed"):
        module.fail_json(msg=said["failed"])
    module.exit_json(**said)


if __name__ == "__main__":
    main()
