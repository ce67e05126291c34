"""Action distrun_program: run one of distrun's node programs on a node with its text and
arguments on the program's stdin, never on a command line.

A raw task sends its command as one argument of the node's shell (``sh -c``), quoted again under
become, and the kernel takes at most 128 KiB in one argument: the preflight's probe alone is more
than half of that, and its config grows with the cluster (every node's name and address). Here the
command line is a fixed loader of a few hundred bytes (distrun.transport.nodeprog.LOADER) and the
program's composed source (the one recipe, nodeprog.text) with its arguments travel on the
connection's stdin, as Ansible's pipelining sends a module: no file on the node, no module's
upload and start, any size. Answers like raw: rc, stdout, stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    from distrun.transport import nodeprog
except ImportError:  # ansible-playbook from another Python: use the package beside the roles
    _here = Path(__file__).resolve()
    for _candidate in (_here.parents[3] / "runner", _here.parents[5]):
        if (_candidate / "distrun" / "transport" / "nodeprog.py").is_file():
            sys.path.insert(0, str(_candidate))
            break
    from distrun.transport import nodeprog

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("program", "argv", "argv_programs", "python"))

    def run(self, tmp=None, task_vars=None):  # noqa: ANN001, ANN201 - Ansible's signature
        result = super().run(tmp, task_vars)
        del tmp
        args = self._task.args
        argv, more = args.get("argv") or [], args.get("argv_programs") or []
        if not isinstance(argv, list) or not isinstance(more, list):
            raise AnsibleActionFail("distrun_program: argv and argv_programs are lists")
        try:
            payload = nodeprog.stdin_payload(str(args.get("program") or ""),
                                             [str(a) for a in argv] + [nodeprog.text(str(p)) for p in more if p])
        except ValueError as exc:
            raise AnsibleActionFail(f"distrun_program: {exc}") from None
        command = nodeprog.loader_command(str(args.get("python") or "/usr/bin/python3"))
        result.update(self._low_level_execute_command(command, in_data=payload, executable=False))
        result["changed"] = True
        if result.get("rc", 0) != 0:
            result["failed"] = True
            result["msg"] = "non-zero return code"
        return result
