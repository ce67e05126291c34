#!/usr/bin/python
"""The documentation of action distrun_program (action_plugins/distrun_program.py), which runs on
the controller and sends a node program on the connection's stdin: this file is never sent."""

from __future__ import annotations

DOCUMENTATION = r"""
module: distrun_program
short_description: Run one of distrun's node programs with its text and arguments on stdin
description:
  - The program's composed source (distrun.transport.nodeprog's one recipe) and its arguments
    travel on the connection's stdin behind a fixed loader; no command line carries them.
  - Answers like ansible.builtin.raw (rc, stdout, stderr); fails on a non-zero exit code.
options:
  program:
    description: The node program (a name of distrun.transport.nodeprog.RECIPES).
    type: str
    required: true
  argv:
    description: Its arguments.
    type: list
    elements: str
    default: []
  argv_programs:
    description: Node programs whose composed source follows argv as more arguments.
    type: list
    elements: str
    default: []
  python:
    description: The node's Python that runs it, isolated (-I -S).
    type: str
    default: /usr/bin/python3
author: distrun
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={"program": {"type": "str", "required": True},
                                          "argv": {"type": "list", "elements": "str", "default": []},
                                          "argv_programs": {"type": "list", "elements": "str", "default": []},
                                          "python": {"type": "str", "default": "/usr/bin/python3"}})
    module.fail_json(msg="distrun_program is an action: it runs on the controller, never on a node")


if __name__ == "__main__":
    main()
