#!/usr/bin/python
"""Ansible module of role ssh_mesh: every node's host keys in one known_hosts, in one call.

Runs as the training user. Each entry is a whole known_hosts line (``aliases keytype key``).
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

DOCUMENTATION = r"""
module: distrun_known_hosts
short_description: Put the cluster's host keys in a known_hosts file in one call
description:
  - Adds every entry that is missing and removes lines of the same hosts and key types that are
    not entries; other lines stay. Reports changed only when the file's lines change.
options:
  path: {description: The known_hosts file., type: path, required: true}
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True},
                       "entries": {"type": "list", "elements": "str", "required": True}},
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        with open(path) as fh:
            current = fh.read().splitlines()
    except FileNotFoundError:
        current = []
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror}")
    try:
        lines = merged(current, module.params["entries"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    changed = lines != current or os.path.islink(path)
    if changed and not module.check_mode:
        write(path, lines)
    module.exit_json(changed=changed, lines=len(lines))


if __name__ == "__main__":
    main()
