#!/usr/bin/python3 -I
"""distrun (role slurm), installed by setup: slurmd runs this as root after a job ends on a node.

When the job's user (SLURM_JOB_UID, from slurmd) has no other job here (squeue; an answer it
cannot get leaves everything as it is), it ends every process of that uid left in slurmd's
cgroup (this program's own: slurmd's child), TERM then KILL after 5 s, and removes
/run/user/<uid> when it is a folder the prolog made (not a mount point or a link) and no process
of the uid is left on the node. Right before that removal it asks squeue and /proc again, so a
job of the user that started meanwhile keeps its folder. It reads only what slurmd gives it, the
kernel (/proc) and Slurm (squeue) say, never a file of the user's, and always exits 0: it never
drains a node.

DISTRUN_EPILOG_ROOT, the folder /proc and /run/user are read under, is for tests: slurmd builds
an epilog's environment itself (its SLURM_* variables, a plugin's SPANK_* ones), so no job sets it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping

ROOT_VARIABLE = "DISTRUN_EPILOG_ROOT"
SQUEUE_TIMEOUT_S = 20
TERM_WAIT_S = 5.0
KILL_WAIT_S = 2.0
# systemd's cgroup of a process: cgroup v2's line, or name=systemd's of v1 and hybrid hierarchies
SYSTEMD_CGROUP = re.compile(r"^(0::|[0-9]+:name=systemd:)")
NUMBER = re.compile(r"[0-9]+")


def other_job(uid: str, job: str, node: str) -> bool | None:
    """Whether the uid has a job on the node besides this one; None when squeue cannot say."""
    try:
        answer = subprocess.run(["squeue", "--noheader", "--format=%A", f"--user={uid}", f"--nodelist={node}"],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if answer.returncode != 0:
        return None
    return any(word != job for word in answer.stdout.split())


def cgroup_of(proc: str, entry: str) -> str:
    try:
        with open(os.path.join(proc, entry, "cgroup"), encoding="utf-8", errors="replace") as f:
            return "".join(line for line in f if SYSTEMD_CGROUP.match(line))
    except OSError:
        return ""


def uid_of(proc: str, entry: str) -> str:
    try:
        with open(os.path.join(proc, entry, "status"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    words = line.split()
                    return words[1] if len(words) > 1 else ""
    except OSError:
        pass
    return ""


def processes(proc: str, uid: str, cgroup: str | None) -> list[int]:
    """The uid's processes, only those in `cgroup` unless it is None; never this program."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    me = os.getpid()
    return [int(e) for e in entries
            if NUMBER.fullmatch(e) and int(e) != me and uid_of(proc, e) == uid
            and (cgroup is None or cgroup_of(proc, e) == cgroup)]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end_leftovers(proc: str, uid: str, cgroup: str) -> None:
    """TERM to every process of the uid in the cgroup, KILL to those left after TERM_WAIT_S."""
    for sig, wait_s in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, KILL_WAIT_S)):
        pids = processes(proc, uid, cgroup)
        if not pids:
            return
        signal_all(pids, sig)
        deadline = time.monotonic() + wait_s
        while processes(proc, uid, cgroup) and time.monotonic() < deadline:
            time.sleep(0.1)


def removable(folder: str) -> bool:
    """A real folder (not a link), not a mount point."""
    try:
        mode = os.lstat(folder).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and not os.path.ismount(folder)


def main(env: Mapping[str, str]) -> None:
    uid, job = env.get("SLURM_JOB_UID", ""), env.get("SLURM_JOB_ID", "")
    if not NUMBER.fullmatch(uid) or not NUMBER.fullmatch(job) or int(uid) < 1000:
        return
    uid = str(int(uid))
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    root = env.get(ROOT_VARIABLE) or "/"
    proc = os.path.join(root, "proc")
    if other_job(uid, job, node) is not False:
        return
    cgroup = cgroup_of(proc, "self")
    if not cgroup:
        return
    end_leftovers(proc, uid, cgroup)
    folder = os.path.join(root, "run", "user", uid)
    if not removable(folder) or processes(proc, uid, None):
        return
    # A job of the user may have started since the first answer (its prolog keeps the folder it
    # finds): ask again right before removing, then look at the uid's processes once more.
    if other_job(uid, job, node) is not False or processes(proc, uid, None) or not removable(folder):
        return
    subprocess.run(["rm", "-rf", "--one-file-system", "--", folder], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


if __name__ == "__main__":
    try:
        main(os.environ)
    except Exception as e:  # never drain a node: slurmd sets a node DRAIN on an epilog's failure
        print(f"distrun-epilog: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(0)
