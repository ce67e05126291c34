"""distrun's node programs and the one recipe that composes their source (``RECIPES``: the shared
head, then a program's parts, then the program), for the runner and the roles alike (role
distrun's filter ``distrun_node_source``); the shell text that runs one of a program's verbs on a
node, and its answer, one JSON object on one line. The same text is sent (``python3 -I -c``) or
installed by setup under its digest's name (``installed``)."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
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
    EXITED = "exited"  # with the exit code its unit's record holds (without a unit: its exit code file)
    GONE = "gone"  # started, no process left, no exit code
    NONE = "none"  # no launcher there, or not yet


LAUNCHER_STATES = tuple(LauncherState)
RUN_TAG = "DISTRUN_RUN_ID"  # the variable that tags a run's processes (node.py's evidence)

# The node programs the runner calls a verb of: node.py (a run's processes: scan, stop, claim),
# launch.py (one attempt's launcher started, in a unit where it runs as root), attempt.py (that
# launcher followed, its state), sign.py (the attempt's ssh certificate, from the user CA root keeps
# on the head), files.py (the run's files the runner writes or removes in the training user's
# folders, with that user's rights) and pack.py (a run's files packed for collect, with that user's
# rights, capped).
PROGRAMS = ("node", "launch", "attempt", "sign", "files", "pack")
# Sent in front of every node program of role job: the names, config checks and answer they share.
HEAD = "nodecommon"
# A part of the programs that act on the training user's files as root: role distrun's switch of a
# root process's filesystem identity (module_utils/distrun_fsuser.py, also the Ansible modules' own),
# with which they take that user's filesystem identity.
FSUSER = "fsuser"


# The preflight probe's parts, composed in this order between the identity switch and probe.py.
PROBE_PARTS = ("probe_config", "userprobe", "probe_fanout", "netprobe", "imageprobe", "probe_env", "probe_ssh",
               "probe_shared", "probe_names", "probe_facts", "probe_ports", "probe_needs", "probe_site", "probe_stage")


@dataclass(frozen=True)
class Recipe:
    """How a program's source is composed: its ``parts`` in order (``role``'s files/, or role
    distrun's identity switch, FSUSER), the program last, behind the shared head (``head``: role
    job's nodecommon.py) where it has one."""

    role: str
    parts: tuple[str, ...]
    head: bool = True


# Every node program: role job's (stage.py unpacks a run's files: role job's stage step and the
# preflight's probe run it; the relay's mesh verb parses with mesh.py; the programs that act on the
# training user's files as root take that user's filesystem identity with FSUSER), role
# preflight's probe (behind the head and the identity switch: its config, how root runs things and
# asks with the training user's rights, its threads, then one part per check; probe.py, the driver
# that reads the config once and prints the report, last) and its GPU health read, and role
# shared_fs's file server of the sshfs mounts (installed on the head, root with the training user's
# filesystem identity).
RECIPES: Mapping[str, Recipe] = {
    "node": Recipe("job", ("claim", "node")),
    "launch": Recipe("job", ("launch",)),
    "attempt": Recipe("job", (FSUSER, "attempt")),
    "sign": Recipe("job", ("sign",)),
    "files": Recipe("job", (FSUSER, "files")),
    "pack": Recipe("job", (FSUSER, "pack")),
    "stage": Recipe("job", (FSUSER, "stage")),
    "relay": Recipe("job", ("mesh", "relay")),
    "probe": Recipe("preflight", (FSUSER, *PROBE_PARTS, "probe")),
    "gpuhealth": Recipe("preflight", ("gpuhealth",), head=False),
    "fileserver": Recipe("shared_fs", (FSUSER, "fileserver"), head=False),
    # The root entry point of people mode: behind the head, its #! line first (ENTRY_SHEBANG: sudo's
    # rule runs the file), the installed programs' paths written into it (ENTRY_TABLE), so its
    # digest names them all.
    "entry": Recipe("job", ("entry",)),
}
SOURCES = tuple(RECIPES)
# Installed by setup (role job's install step), root's files under a name that carries their text's
# digest, so a node set up by another version of distrun has no file of that name (the preflight
# says to run setup) rather than an older protocol: relay.py, which the training user runs but
# cannot change (what a launcher starts over ssh joins its node's unit through it), and, for people
# mode, the root entry point (entry.py, the one program a person runs as root, through sudo) and
# the root programs it runs (PROGRAMS).
INSTALLED = ("relay", "entry", *PROGRAMS)
# entry.py's line that the recipe fills with the installed programs' paths.
ENTRY_TABLE = "PROGRAMS: dict = {}  # the recipe writes the installed programs' paths here (nodeprog.text)\n"
PROGRAMS_DIR = "/usr/local/lib/distrun"
# The installed entry point's first line: sudo's rule runs the file itself, with Python's isolated mode.
ENTRY_SHEBANG = "#!/usr/bin/python3 -I\n"


def files(program: str) -> list[Path]:
    """The files a program's source is joined from, in order."""
    if program not in RECIPES:
        raise ValueError(f"no node program {program!r}")
    recipe = RECIPES[program]
    head = [part_path(HEAD)] if recipe.head else []
    return [*head, *(part_path(name, recipe.role) for name in recipe.parts)]


def part_path(name: str, role: str = "job") -> Path:
    """Where a program or a part of one lies in the project: ``role``'s files/, or role distrun's
    identity switch (FSUSER)."""
    roles = paths.project_dir() / "roles"
    if name == FSUSER:
        return roles / "distrun" / "module_utils" / "distrun_fsuser.py"
    return roles / role / "files" / f"{name}.py"


@cache
def text(program: str = "node") -> str:
    """A program's source, sent on the command line (it needs no file on the node) or installed:
    its files joined (each ending its last line), one namespace. The one recipe: the roles take the
    same text through role distrun's filter ``distrun_node_source``."""
    texts = [path.read_text() for path in files(program)]
    joined = "".join(t if t.endswith("\n") else t + "\n" for t in texts)
    if program == "entry":
        if joined.count(ENTRY_TABLE) != 1:
            raise ValueError(f"entry.py has not exactly one line {ENTRY_TABLE.strip()!r}")
        table = json.dumps({name: installed(name) for name in PROGRAMS}, sort_keys=True)
        joined = ENTRY_SHEBANG + joined.replace(ENTRY_TABLE,
                                                f"PROGRAMS: dict = {table}  # written by the recipe (nodeprog.text)\n")
    return joined


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


def entry_command(verb: str, config: dict[str, Any], program: str = "node") -> str:
    """Shell text that asks the installed root entry point (people mode) for program's verb with
    config: sudo's one rule for the people's group names that file alone; nothing else runs as root."""
    if program not in PROGRAMS:
        raise ValueError(f"no node program {program!r} behind the entry point")
    return (f"exec sudo -n {shlex.quote(installed('entry'))} {shlex.quote(program)} {shlex.quote(verb)} "
            f"{shlex.quote(json.dumps(config))}")


# What a node's Python runs where a program's text and arguments come on its stdin (role distrun's
# action distrun_program): one JSON object, {"source": <the composed text>, "argv": [...]}, read to
# its end; the program then runs as under ``-c``, in __main__, with those arguments. A command line
# of a few hundred bytes whatever the program and its config: the kernel takes at most 128 KiB in
# one argument (MAX_ARG_STRLEN), and the probe's text with a large cluster's config is more.
LOADER = ('import sys,json;_distrun=json.loads(sys.stdin.buffer.read());sys.argv[1:]=_distrun["argv"];'
          'exec(compile(_distrun.pop("source"),"<distrun>","exec"))')


def loader_command(python: str = "/usr/bin/python3") -> str:
    """The command line that runs a program sent on stdin (``stdin_payload``) under ``python``, isolated."""
    return f"{shlex.quote(python)} -I -S -c {shlex.quote(LOADER)}"


def stdin_payload(program: str, argv: list[str]) -> bytes:
    """What the loader reads on stdin: ``program``'s composed text and its arguments."""
    return json.dumps({"source": text(program), "argv": [str(a) for a in argv]}).encode()


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
