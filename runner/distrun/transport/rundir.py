"""The run directory on the nodes: every entry's name, written once.

A run directory holds what a run's attempts share (the hostfile, the rank wrapper, env.sh, the
launcher's rendered files, the user's program) and, for each attempt, a folder of its own,
``attempts/<n>/`` (n = the plan's ``restart``): its launch scripts, each launch host's pid,
process group, log and exit code, the started-rank markers, and what the launcher writes there
(its declaration, ``Launcher.attempt_files``: the ranks' logs, a scheduler's own output).
Nothing is ever moved between attempts: a launcher of a failed attempt that ends late writes
into its own attempt's folder, never into the next one's.

A run recorded in the layout before that (its plan.json lacks ``attempt_dirs``) kept these
files at the top of the run directory, and a restart there moved them to ``attempts/<n>/``:
``attempt_folder`` answers "" for such a plan, and ``collected_attempt`` finds the last
attempt's files in a collected copy of either layout, until store/retiring.py's version.

Names that take a host are plain text around it, so a shell line may pass ``"$h"``.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan



def run_dir(shared_dir: str, run_id: str) -> str:
    """Where a run's directory is on the nodes: the one rule, for plans and recorded plan.json alike."""
    return f"{shared_dir.rstrip('/')}/runs/{run_id}"


def checkpoint_dir(shared_dir: str, run_id: str) -> str:
    """A run's checkpoints, in the shared folder outside its run directory: they survive restarts
    and are not collected with the logs."""
    return f"{shared_dir.rstrip('/')}/checkpoints/{run_id}"


ATTEMPTS = "attempts"
# At the top of the run directory, shared by its attempts.
HOSTFILE = "hostfile"  # the MPI hostfile of the run's placement
WRAPPER = "rank-env.sh"  # the rank wrapper every rank starts through
ENV_FILE = "env.sh"  # the user's --env values, 0600, removed when the run ends
CONTAINER_SCRIPT = "container-run.sh"  # with --image: the start of one container
RESULT = "result.json"  # the reference workloads' result
# Inside an attempt's folder (beside the launcher's own files).
STARTED = "started"  # one marker per started rank, written by the rank wrapper
# In STARTED, with a launcher that restarts in place: one line per start of a node's local rank,
# "starts-<host>-<local rank>" (the wrapper counts its DISTRUN_RESTART there). The job can write
# them: what they say is the job's own claim (run/starts.py), never the ground for a decision.
STARTS_PREFIX = "starts-"
# The attempt's ssh key pair (0600) and its certificate from the head's user CA: the run's hosts,
# minutes, the relay's mesh verb only (roles/job/files/sign.py). ssh reads the certificate from
# beside the key.
MESH_KEY = "mesh-key"
MESH_CERT = "mesh-key-cert.pub"


def launch_script(host: str) -> str:
    return f"launch-{host}.sh"


def launcher_pid(host: str) -> str:
    return f"launcher-{host}.pid"


def launcher_pgid(host: str) -> str:
    return f"launcher-{host}.pgid"


def launcher_log(host: str) -> str:
    return f"launcher-{host}.log"


def exit_code(host: str) -> str:
    return f"exitcode-{host}"


# What one attempt writes under any launcher, as shell patterns inside its folder; each launcher
# adds its own (Launcher.attempt_files).
ATTEMPT_FILES = ("launch-*.sh", "launcher-*", "exitcode-*", STARTED)

# What distrun itself writes at the top of a run directory on the nodes, under any launcher
# (exact names, then shell patterns): a user's --script of such a name would replace distrun's
# file or be replaced by it. The attempt files are among them: at the top they mark a collected
# run of the layout before attempt folders (collected_attempt; store/retiring.py). A launcher's
# own files are its declaration (Launcher.run_dir_files, run_dir_patterns);
# tests/unit/test_cli_args.py renders every launcher's files against both.
RUN_DIR_NAMES = (HOSTFILE, WRAPPER, CONTAINER_SCRIPT, ENV_FILE, RESULT, ATTEMPTS, STARTED)
RUN_DIR_PATTERNS = ("launch-*.sh", "launcher-*", "exitcode-*")


def named(name: str, names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``names`` or matches one of the shell ``patterns``."""
    return name in names or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def clashes(name: str) -> bool:
    """Whether a file of this name at the top of a run directory would collide with distrun's."""
    return named(name, RUN_DIR_NAMES, RUN_DIR_PATTERNS)


def folder(restart: int, own: bool = True) -> str:
    """An attempt's folder relative to the run directory ("" in a recorded run without attempt folders)."""
    return f"{ATTEMPTS}/{int(restart)}" if own else ""


def attempt_folder(plan: JobPlan) -> str:
    """The plan's attempt's folder relative to the run directory ("" in a recorded run without attempt folders)."""
    return folder(plan.attempt.restart, plan.attempt.attempt_dirs)


def attempt_path(plan: JobPlan) -> str:
    """The plan's attempt's folder on the nodes, absolute."""
    rel = attempt_folder(plan)
    return f"{plan.run_dir}/{rel}" if rel else plan.run_dir


def mesh_key(plan: JobPlan) -> str:
    """The attempt's ssh key on the nodes, absolute (its certificate beside it: MESH_CERT)."""
    return f"{attempt_path(plan)}/{MESH_KEY}"


def in_attempt(plan: JobPlan, name: str) -> str:
    """``name`` inside the plan's attempt's folder, relative to the run directory."""
    rel = attempt_folder(plan)
    return f"{rel}/{name}" if rel else name


def collected_attempt(nodes_dir: Path) -> str:
    """In a collected copy of a run directory (``nodes/<host>/...``), the last attempt's folder
    relative to each host's copy: "attempts/<n>" with the highest n, or "" where the attempt's
    files lie at the top (a run recorded before attempt folders, whose last attempt stayed there:
    store/retiring.py)."""
    if any(p.is_file() for p in nodes_dir.glob("*/launcher-*")):
        return ""
    numbers = [int(p.name) for p in nodes_dir.glob(f"*/{ATTEMPTS}/*") if p.is_dir() and p.name.isdigit()]
    return folder(max(numbers)) if numbers else ""


def read_job_file(path: Path, max_bytes: int) -> bytes | None:
    """A collected file the job could have written, read bounded: its bytes where it is a regular
    file (opened without following a link, without waiting on a FIFO) of at most max_bytes; None
    where it is missing, anything else, or larger."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, max_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= max_bytes else None
