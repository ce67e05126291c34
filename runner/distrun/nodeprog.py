"""Role job's node program (``roles/job/files/node.py``) as the runner calls it: the shell text
that runs one of its verbs on a node, and its answer, one JSON object on one line."""

from __future__ import annotations

import json
import shlex
from functools import cache
from typing import Any

from . import paths


@cache
def text() -> str:
    """The program's source, sent on the command line (it needs no file on the node)."""
    return (paths.project_dir() / "roles" / "job" / "files" / "node.py").read_text()


def command(verb: str, config: dict[str, Any]) -> str:
    """Shell text that runs verb with config under the node's system Python, isolated (-I):
    neither the working directory, PYTHON* variables nor the user's site folder, all of which a
    job can write, reach its imports."""
    return ('py=/usr/bin/python3; [ -x "$py" ] || py=python3; '
            f'exec "$py" -I -c {shlex.quote(text())} {shlex.quote(verb)} {shlex.quote(json.dumps(config))}')


def answer(output: str, verb: str) -> dict[str, Any] | None:
    """The verb's answer in output (the last line that is one), or None when it gave none."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("verb") == verb:
            return obj
    return None
