#!/usr/bin/python
"""Ansible module of role distrun: refuse to write through links a job may have planted.

The training user's jobs can write in its home and in the shared folder. Before a role writes
there as root (or as that user on root's behalf), it asks this module, in one call per node,
whether any of the paths it is about to write is a link; the module fails with one line per
link, naming the node, the path, where it points and the fix. Parent folders are resolved as
the kernel resolves them; only the last component of each path is looked at (lstat).
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: distrun_no_links
short_description: Fail when any of the given paths is a symbolic link
description:
  - Checks each path with lstat. Fails, naming every link found, where it points and the fix,
    when any is a link; reports no change otherwise. Missing paths are fine.
options:
  paths: {description: The paths to check, named in the message as given (~user is expanded)., type: list, elements: str, required: true}
  host: {description: The node's inventory name, for the message., type: str, required: true}
author: distrun
"""


def links(paths: list[str]) -> list[tuple[str, str]]:
    """(path, where it points) of each path that is a link, in the order given."""
    found = []
    for path in paths:
        real = os.path.expanduser(path)
        if os.path.islink(real):
            try:
                target = os.readlink(real)
            except OSError as exc:
                target = f"unreadable: {exc.strerror}"
            found.append((path, target))
    return found


def message(found: list[tuple[str, str]], host: str) -> str:
    return "; ".join(f"remove the link {path} on {host} (it points to {target}) "
                     "and run distrun setup again" for path, target in found)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "str", "required": True},
                       "host": {"type": "str", "required": True}},
        supports_check_mode=True,
    )
    p = module.params
    found = links(p["paths"])
    if found:
        module.fail_json(msg=message(found, p["host"]), links=[path for path, _ in found])
    module.exit_json(changed=False, links=[])


if __name__ == "__main__":
    main()
