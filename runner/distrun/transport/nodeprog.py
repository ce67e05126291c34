"""Role job's node programs (``roles/job/files/node.py``, ``launch.py``, ``attempt.py``) as the
runner calls them: the source sent (the programs' shared head, ``nodecommon.py``, in front of the
program), the shell text that runs one of its verbs on a node, and its answer, one JSON object on
one line."""

from __future__ import annotations

import hashlib
import json
import shlex
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from distrun import paths

# The protocol's names, as the node programs' shared head (nodecommon.py) writes them; a unit
# test holds the two equal. A follower's log lines arrive as "| <line>", data whatever they say;
# anything else on its stream is the node program's.
LOG_PREFIX = "| "


class LauncherState(StrEnum):
    """attempt.py's state of one launcher on its node."""

    RUNNING = "running"
    EXITED = "exited"  # with the exit code its unit's record (or the older exit code file) holds
    GONE = "gone"  # started, no process left, no exit code
    NONE = "none"  # no launcher there, or not yet


LAUNCHER_STATES = tuple(LauncherState)
RUN_TAG = "DISTRUN_RUN_ID"  # the variable that tags a run's processes (node.py's evidence)

# The node programs: node.py (a run's processes: scan, stop, claim), launch.py (one attempt's
# launcher started, in a unit where it runs as root), attempt.py (that launcher followed, its state)
# sign.py (the attempt's ssh certificate, from the user CA root keeps on the head), files.py (the
# run's files the runner writes or removes in the training user's folders, with that user's rights)
# and pack.py (a run's files packed for collect, with that user's rights, capped).
PROGRAMS = ("node", "launch", "attempt", "sign", "files", "pack")
# Every program sent behind the head: stage.py too (the run's files unpacked), which role job's
# stage step and role preflight's probe send themselves (the runner has no verb of it), and the
# installed ones below.
SOURCES = (*PROGRAMS, "stage", "relay")
# Sent in front of every node program: the names, config checks and answer they share.
HEAD = "nodecommon"
# Installed by setup (role job's install step), root's files the training user runs but cannot
# change: relay.py, through which what a launcher starts over ssh joins its node's unit. Each
# under a name that carries its text's digest, so a node set up by another version of distrun
# has no file of that name (the preflight says to run setup) rather than an older protocol.
INSTALLED = ("relay",)
# Files composed between the head and a program: the relay's mesh verb parses with mesh.py; the
# programs that act on the training user's files as root take that user's filesystem identity
# with role distrun's switch (module_utils/distrun_fsuser.py, also the Ansible modules' own).
FSUSER = "fsuser"
PARTS = {"relay": ("mesh",), "attempt": (FSUSER,), "stage": (FSUSER,), "files": (FSUSER,), "pack": (FSUSER,)}
PROGRAMS_DIR = "/usr/local/lib/distrun"


@cache
def text(program: str = "node") -> str:
    """A program's source, sent on the command line (it needs no file on the node): the shared
    head, then its PARTS, then the program, one namespace (role job's stop and stage steps and run.yml's stage
files for the preflight's probe compose the same two files; role job's install step the relay's three)."""
    if program not in SOURCES:
        raise ValueError(f"no node program {program!r}")
    texts = [part_path(name).read_text() for name in (HEAD, *PARTS.get(program, ()), program)]
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts[:-1]) + texts[-1]


def part_path(name: str) -> Path:
    """Where a program or a part of one lies in the project."""
    roles = paths.project_dir() / "roles"
    if name == FSUSER:
        return roles / "distrun" / "module_utils" / "distrun_fsuser.py"
    return roles / "job" / "files" / f"{name}.py"


def installed(program: str) -> str:
    """Where setup puts a program of INSTALLED on every node: its composed text's digest in its name."""
    if program not in INSTALLED:
        raise ValueError(f"no installed node program {program!r}")
    digest = hashlib.sha256(text(program).encode()).hexdigest()[:12]
    return f"{PROGRAMS_DIR}/{program}-{digest}.py"


def relay_argv(run_id: str, attempt: int, verb: str) -> list[str]:
    """The installed relay for one attempt of a run: ``serve`` (the launch script of a node a
    launcher reaches over ssh) or ``join`` (the command, which follows, handed to that node's relay)."""
    return ["python3", "-I", installed("relay"), verb, run_id, str(int(attempt))]


def mesh_command() -> str:
    """The command every certificate of the user CA forces on the nodes: the installed relay's
    mesh verb (role ssh_mesh writes it into each node's principals file; sign.py into each run's
    certificate)."""
    return f"/usr/bin/python3 -I {installed('relay')} mesh"


def command(verb: str, config: dict[str, Any], program: str = "node") -> str:
    """Shell text that runs verb with config under the node's system Python, isolated (-I):
    neither the working directory, PYTHON* variables nor the user's site folder, all of which a
    job can write, reach its imports."""
    return ('py=/usr/bin/python3; [ -x "$py" ] || py=python3; '
            f'exec "$py" -I -c {shlex.quote(text(program))} {shlex.quote(verb)} {shlex.quote(json.dumps(config))}')


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
