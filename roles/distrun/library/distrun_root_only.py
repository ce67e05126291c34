#!/usr/bin/python
"""Ansible module of role distrun: refuse a path root installs from that others can write.

Setup installs, as root, from paths the inventory names: a wheelhouse, local packages, a conda
channel or installer, the env whose pip and Python root runs. Whoever can write such a path, or
rename any folder above it, can put code there that root then runs (a wheel carrying a `.pth`
file is enough). Before the first install, a role asks this module, in one call per node,
about every such path; it fails with one line per path that anyone but root (or, on the
controller, the admin running setup) can change: the path itself or any folder above it, links
along the way followed and checked too. The first unsafe component is named, with the fix.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: distrun_root_only
short_description: Fail when anyone but root can change a path root installs from
description:
  - Walks each path from / down, component by component, following links (each link's target is
    walked too). Fails, naming the variable, the path, the first component others can change and
    the fix, when a component is owned by another user or writable by its group or by everyone
    (a sticky folder such as /tmp protects only the entries that already exist in it and are
    root's). The part of a path that does not exist yet is fine when the folder that would hold
    it is safe. Reports no change otherwise.
options:
  paths:
    description: What to check, each a dict with `name` (the variable, for the message) and `path` (absolute).
    type: list
    elements: dict
    required: true
  host: {description: The node's inventory name, for the message., type: str, required: true}
  trust_own_user:
    description: Also accept components owned by the user the module runs as (the controller's admin).
    type: bool
    default: false
author: distrun
"""

FIX = "make it root-owned and not writable by others, outside the shared folder, and run distrun setup again"
MAX_LINKS = 40


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _unsafe(st: os.stat_result, trusted: set[int], last: bool) -> str | None:
    """Why others can change this component, or None. An intermediate sticky folder (/tmp) is
    fine: nobody but root can rename or remove root's entries in it, and the next component is
    checked on its own."""
    if st.st_uid not in trusted:
        return f"is owned by {_owner(st.st_uid)}"
    mode = st.st_mode
    sticky_dir = stat.S_ISDIR(mode) and bool(mode & stat.S_ISVTX)
    if mode & stat.S_IWOTH and (last or not sticky_dir):
        return "is writable by everyone"
    if mode & stat.S_IWGRP and (last or not sticky_dir):
        return f"is writable by group {_group(st.st_gid)}"
    return None


def first_unsafe(path: str, trusted: set[int]) -> tuple[str, str, list[str]] | None:
    """(component, why, links followed as 'LINK -> TARGET') for the first component of `path`
    that anyone outside `trusted` can change, walking from / as the kernel resolves it; None when
    every existing component is safe."""
    links: list[str] = []
    pending = [part for part in path.split("/") if part]
    current = "/"
    why = _unsafe(os.lstat("/"), trusted, not pending)
    if why:
        return "/", why, links
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)  # already checked on the way down
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            # Nobody but root can create it: the folder that would hold it was found safe (a
            # sticky one is not enough, as anyone may create a new entry there).
            parent = os.lstat(current)
            if stat.S_ISDIR(parent.st_mode) and parent.st_mode & stat.S_ISVTX and parent.st_mode & 0o022:
                return current, f"is writable by others and {candidate} does not exist yet", links
            return None
        except NotADirectoryError:
            return None
        except OSError as exc:
            return candidate, f"cannot be checked ({exc.strerror})", links
        if stat.S_ISLNK(st.st_mode):
            if len(links) >= MAX_LINKS:
                return candidate, "starts a loop of links", links
            target = os.readlink(candidate)
            links.append(f"{candidate} -> {target}")
            if target.startswith("/"):
                current = "/"
            pending = [part for part in target.split("/") if part] + pending
            continue
        why = _unsafe(st, trusted, not pending)
        if why:
            return candidate, why, links
        current = candidate
    return None


def problems(items: list[dict], host: str, trusted: set[int]) -> list[str]:
    out = []
    for item in items:
        name, path = item["name"], os.path.expanduser(str(item["path"]))
        if not path.startswith("/"):
            out.append(f"{name} {item['path']} on {host} is not an absolute path: "
                       "give the absolute path of a root-owned folder or file and run distrun setup again")
            continue
        found = first_unsafe(path, trusted)
        if found:
            component, why, links = found
            via = f" (through the link {', '.join(links)})" if links else ""
            out.append(f"{name} {item['path']} on {host} can be changed by others than root: "
                       f"{component} {why}{via}; {FIX}")
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "dict", "required": True},
                       "host": {"type": "str", "required": True},
                       "trust_own_user": {"type": "bool", "default": False}},
        supports_check_mode=True,
    )
    p = module.params
    trusted = {0, os.geteuid()} if p["trust_own_user"] else {0}
    found = problems(p["paths"], p["host"], trusted)
    if found:
        module.fail_json(msg="; ".join(found))
    module.exit_json(changed=False)


if __name__ == "__main__":
    main()
