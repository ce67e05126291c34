"""The head of distrun's node programs (node.py, launch.py, attempt.py beside it): the names and
the call protocol they share, written once.

It is sent in front of each program as one source, ``python3 -I -c <nodecommon.py + program>
VERB '<config JSON>'`` (runner/distrun/transport/nodeprog.py composes it; so does role job's stop.yml), so a
program uses these definitions without an import, and a node needs no file of distrun's. Run as
a file on the controller (the unit tests), a program reads this file from beside it into its
own namespace: the same one namespace as on a node. Standard library only; Python 3.9 or newer.

The protocol: every verb prints one JSON object as its last line, ``{"verb": VERB, ...}``
(``answer``; runner/distrun/transport/nodeprog.py's ``answer`` reads it back); a bad call prints one line,
``<program>: <why>``, on stderr and exits 2 (``serve``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys

NODECOMMON = True  # this head was sent in front of the program (the programs look for this name)

# A run id, a host, the training user, a script's name: one plain path component, as a unit's
# name and a path under the shared folder take it.
NAME = re.compile(r"[A-Za-z0-9._-]{1,80}")
ATTEMPT = re.compile(r"[0-9]{1,9}")  # an attempt's number
# launch.py's unit of one attempt on one node, distrun:<run>:<attempt>:<host>.service (unit_name);
# node.py reads the run from it.
UNIT = re.compile(r"distrun:([A-Za-z0-9._-]{1,80}):[0-9]{1,9}:[A-Za-z0-9._-]{1,80}\.service")
# Root's records of each unit, <unit>.launched and <unit>.exit, in a folder only root writes.
RECORDS = "/run/distrun"
TAG = "DISTRUN_RUN_ID"  # the variable that tags a run's processes with its id
LOG_PREFIX = "| "  # a line of the launcher's log as attempt.py's follow prints it: data, never an answer
LAUNCHER_STATES = ("running", "exited", "gone", "none")  # attempt.py's state of a launcher
# The run directory's entries the node programs touch (the runner's transport/rundir.py names them too).
ATTEMPTS = "attempts"  # the folder of attempt folders
ENV_FILE = "env.sh"  # the user's --env values, 0600
SUPERVISOR_RECORD = "supervisor.json"  # in an attempt's folder: the head supervisor's tries (supervise.py)


class CallError(Exception):
    """A bad call, in one line."""


def plain_name(value: object) -> bool:
    """Whether value is a plain name (NAME), and not "." or ".."."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None and set(value) != {"."}


def unit_name(cfg: dict) -> str:
    """The attempt's unit on this node (launch.py starts it; UNIT reads it)."""
    return f"distrun:{cfg['run']}:{cfg['attempt']}:{cfg['host']}.service"


def system_units(proc: str = "/proc") -> str:
    """Where the system manager's units lie in the cgroup paths /proc shows: beside init's own
    cgroup (``/system.slice/`` on a machine; under a container's path on a container node)."""
    try:
        with open(f"{proc}/1/cgroup", "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:
        text = ""
    init = [ln.split(":", 2)[2] for ln in text.splitlines() if ln.startswith("0::") or ":name=systemd:" in ln]
    return (os.path.dirname(init[-1]).rstrip("/") if init else "") + "/system.slice/"


def unit_in(cgroup: str, units: str) -> "re.Match | None":
    """The distrun unit (UNIT, its run in group 1) that a /proc/<pid>/cgroup text puts a process
    in, as a unit of the system manager (``units``: system_units); None for any other cgroup,
    the training user's own manager's included (a path elsewhere keeps a "/" after the prefix)."""
    lines = cgroup.strip().splitlines() or [""]
    return UNIT.fullmatch(lines[-1].split(":", 2)[-1].removeprefix(units))


def unit_processes(unit: str, proc: str = "/proc") -> int:
    """How many live processes the kernel keeps in the system manager's unit ``unit`` (their
    /proc/<pid>/cgroup, whatever their uid, environment or name say)."""
    units, n = system_units(proc), 0
    for name in filter(str.isdigit, os.listdir(proc)):
        try:
            with open(f"{proc}/{name}/cgroup", "rb") as f:
                m = unit_in(f.read(4096).decode(errors="replace"), units)
        except OSError:
            continue
        n += m is not None and m.group(0) == unit
    return n


def record_path(unit: str, kind: str) -> str:
    """Root's record of a unit: kind "launched" (launch.py started it), "exit" (how it ended)."""
    return os.path.join(RECORDS, f"{unit}.{kind}")



def root_file(path: str) -> bytes | None:
    """A regular file that root owns in a folder that only root writes (its first 4 KiB), else None."""
    try:
        folder = os.lstat(os.path.dirname(path))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if folder.st_uid != 0 or folder.st_mode & 0o022 or st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            return None
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def small_json(path: str, limit: int = 64 << 10) -> "dict | None":
    """A JSON object in a regular file of at most limit bytes (opened without following a link),
    else None: a file of the training user's, said as it is, never trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            data = os.read(fd, limit + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        said = json.loads(data) if 0 < len(data) <= limit else None
    except (OSError, ValueError):
        return None
    return said if isinstance(said, dict) else None


def record_status(text: str) -> int | None:
    """The exit code a record says: 'RESULT exited N' is N, 'RESULT killed SIG' is 128 + SIG."""
    words = text.split()
    if len(words) != 3:
        return None
    if words[1] == "exited" and words[2].isdigit():
        return int(words[2])
    if words[1] in ("killed", "dumped"):
        try:
            return 128 + int(signal.Signals["SIG" + words[2]])
        except KeyError:
            return None
    return None


def unit_gone(unit: str) -> bool:
    """Whether systemd no longer runs the unit (ended, failed or forgotten): with no exit record
    beside it, its ExecStopPost never ran, as when systemd could not set up the unit's sandbox.
    False where systemctl cannot say (no systemd here: the record alone decides)."""
    try:
        out = subprocess.run(["systemctl", "show", "--property=LoadState,ActiveState", "--", unit],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    props = dict(ln.partition("=")[::2] for ln in out.stdout.splitlines())
    if out.returncode != 0 or "ActiveState" not in props:
        return False
    return props.get("LoadState") == "not-found" or props["ActiveState"] in ("inactive", "failed")


def unit_failure(unit: str) -> str:
    """Why systemd could not run the unit, in one line from its journal (root reads it), or "".
    Only root's entries count (journald's _UID, which no sender sets): the job's output is in the
    unit's journal too, as the training user's, and a job's words never become the reason."""
    try:
        out = subprocess.run(["journalctl", "--quiet", "--no-pager", "--output=json", "--lines=30", f"--unit={unit}"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = []
    for entry in out.stdout.splitlines():
        try:
            said = json.loads(entry)
        except ValueError:
            continue
        text = said.get("MESSAGE") if isinstance(said, dict) and said.get("_UID") == "0" else None
        if isinstance(text, str) and text.removeprefix(f"{unit}: ").startswith("Failed"):
            lines.append(text.removeprefix(f"{unit}: "))
    why = "".join(c for c in next((ln for ln in lines if ln.startswith("Failed to")), lines[0] if lines else "")
                  if c.isprintable())[:200]
    if "namespac" in why:
        why += (" (the unit's private /tmp and /dev/shm need mount namespaces: a machine's systemd has them,"
                " a container needs CAP_SYS_ADMIN)")
    return why


def check_attempt(verb: str, cfg: dict) -> None:
    """The config that names one attempt on one node (attempt.py's and launch.py's): run, host,
    user and script plain names, attempt a number, dir an absolute path."""
    for key in ("run", "host", "user", "script"):
        if not plain_name(cfg.get(key)):
            raise CallError(f"{verb}: {key} {cfg.get(key)!r} is empty or not a plain name")
    if not ATTEMPT.fullmatch(str(cfg.get("attempt", ""))):  # as node.py's stop reads a unit
        raise CallError(f"{verb}: attempt {cfg.get('attempt')!r} is not a number")
    if not (isinstance(cfg.get("dir"), str) and os.path.isabs(cfg["dir"])):
        raise CallError(f"{verb}: dir {cfg.get('dir')!r} is not an absolute path")


def answer(obj: dict) -> None:
    """A verb's answer: one JSON object on one line of stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def serve(program: str, verbs: dict, argv: list, check, errors: tuple = (KeyError,)) -> int:
    """Run argv (VERB '<config JSON>') with verbs, its config checked by check(verb, cfg) first,
    and print its answer; a bad call (CallError or one of errors, a missing key) is one line
    "<program>: why" on stderr and exit 2."""
    try:
        if len(argv) != 2 or argv[0] not in verbs:
            names = ",".join(verbs) if len(verbs) == 1 else "{" + ",".join(verbs) + "}"
            raise CallError(f"usage: {program} {names} '<config JSON>' (got {' '.join(argv[:1]) or 'nothing'})")
        try:
            cfg = json.loads(argv[1])
        except ValueError:
            raise CallError(f"the {argv[0]} config is not JSON") from None
        if not isinstance(cfg, dict):
            raise CallError(f"the {argv[0]} config is not a JSON object")
        check(argv[0], cfg)
        said = verbs[argv[0]](cfg)
    except (CallError, *errors) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"{program}: {what}", file=sys.stderr, flush=True)
        return 2
    answer(said)
    return 0
