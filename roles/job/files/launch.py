"""distrun's node program that starts one attempt's launcher on one node: ``bash <script>`` in
the attempt's folder, as the training user, detached; role job's files/attempt.py follows it.

``python3 -I -c <nodecommon.py + this file> launch '<config JSON>'``. Standard library only;
Python 3.9 or newer. It prints one JSON object as its last line: {"verb": "launch", "launched":
true, "unit": U} ("" without a unit) or {"verb": "launch", "error": why}; a bad call prints one
line on stderr and exits 2 (nodecommon.py: the protocol, the names and the config's checks).
The config is attempt.py's (``run``, ``host``, ``attempt``, ``dir``, ``script``,
``user``; ``run_dir``), and ``limits``: [name, value] resource limits the launcher and everything
it starts get (the inventory's distrun_unit_limits: the unit's Limit*= properties, or set on the
session without systemd).

The control plane. Run as root on a node whose init is systemd, it starts the script as a
transient unit ``distrun:<run>:<attempt>:<host>.service`` running as the training user: every
process the script forks stays in the unit's cgroup (setsid, a double fork or a dropped
environment do not leave it; the training user cannot move a process out), the unit ends when
the script ends, and systemd then kills what is left in it. Its ExecStopPost, run by systemd as
root, writes how the script ended into ``/run/distrun/<unit>.exit``, in a folder only root
writes: that record, not a file in the run directory, is the exit code attempt.py answers.
Without root or without systemd, the script runs in its own session instead and writes its exit
code into its attempt's folder, which the job can write too (the limits in
docs/guide/security.md). Root does nothing here with a path the job controls: the unit, as the
training user, opens the script.
"""

import os
import pwd
import re
import resource
import subprocess
import sys
import time

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): nodecommon.py from beside it
    _HEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodecommon.py")
    with open(_HEAD, encoding="utf-8") as _head:
        exec(compile(_head.read(), _HEAD, "exec"))  # the same one namespace as the composed source on a node

STOP_S = 8  # what the unit's processes get between TERM and KILL when it ends
# How long a unit's records stay in /run/distrun after its end (its .exit record's age): a run
# reconciled later than that ('distrun status' of a detached run nobody followed) reads as lost.
KEEP_S = 30 * 24 * 3600
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNTIME = "/run/user"  # the users' runtime folders, /run/user/<uid>, as logind names them


def _systemd() -> bool:
    return os.geteuid() == 0 and os.path.isdir("/run/systemd/system")


def prune(folder: str, now: "float | None" = None) -> int:
    """Remove the records of units that ended more than KEEP_S ago (their .exit record's age),
    so /run/distrun (memory) does not grow with every attempt; a running unit (no .exit record
    yet) keeps its own. How many units' records went."""
    now = time.time() if now is None else now
    gone = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if not name.endswith(".exit"):
            continue
        unit = name[: -len(".exit")]
        try:
            if now - os.lstat(os.path.join(folder, name)).st_mtime <= KEEP_S:
                continue
        except OSError:
            continue
        for kind in ("launched", "exit"):
            try:
                os.unlink(os.path.join(folder, f"{unit}.{kind}"))
            except OSError:
                pass
        gone += 1
    return gone


def runtime_private(uid: int, gid: int) -> list:
    """systemd-run's properties that give a run's unit a runtime folder of its own at the training
    user's /run/user/<uid> (a memory folder of the unit's, 0700, the user's, gone with the unit),
    and the unit's XDG_RUNTIME_DIR is set to it (launch's environment). Rootless podman keeps its
    state there, its pause process among it, so every podman of the run starts that pause process
    inside the unit, which ends it with the run: nothing of the user's lives on between runs, and
    the node needs neither lingering nor the user's own systemd manager. Whatever the node's own
    folder holds (a login's manager and its bus, where a login made one) is out of the run's
    reach: systemd-run --user from a job finds no manager."""
    folder = f"{RUNTIME}/{int(uid)}"
    return ["-p", f"TemporaryFileSystem={folder}:mode=0700,uid={int(uid)},gid={int(gid)}"]


# What a run has to itself, and what ends with its unit: its own /tmp (removed at the unit's end),
# its own /dev/shm (a memory folder of the unit's, gone with it: a plain TemporaryFileSystem would be
# root's 0755), its own System V IPC and POSIX message queues (a namespace that ends with its last
# process), and a /proc that shows it only its own user's processes (no other account's, root's
# included). RemoveIPC= is not used: it would remove every IPC object of the user's uid, which
# other runs of the same account hold.
PRIVATE = ("-p", "PrivateTmp=yes", "-p", "PrivateIPC=yes", "-p", "TemporaryFileSystem=/dev/shm:mode=1777,nosuid,nodev",
           "-p", "ProtectProc=invisible")

_GPU_NODE = re.compile(r"nvidia([0-9]+)")


def gpu_fence(gpus: object, dev: str = "/dev") -> list:
    """systemd-run's properties that keep the node's other GPUs out of a run's unit: each GPU's
    device node (/dev/nvidia<N>, N as nvidia-smi numbers them) that the run was not given is
    replaced by an inaccessible one in the unit's mount namespace, so no rank of the run opens it
    whatever CUDA_VISIBLE_DEVICES says (a job cannot make device nodes: it has no CAP_MKNOD).
    The control nodes (nvidiactl, nvidia-uvm) stay: every GPU program needs them. ``gpus`` absent
    (None): the run holds the whole node, nothing is hidden."""
    if gpus is None:
        return []
    if not (isinstance(gpus, list) and all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1000
                                           for g in gpus)):
        raise CallError(f"launch: gpu_ids {gpus!r} is not a list of GPU indices")
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    found = sorted((int(m.group(1)), m.string) for m in map(_GPU_NODE.fullmatch, names) if m)
    return [arg for index, name in found if index not in gpus for arg in ("-p", f"InaccessiblePaths=-{dev}/{name}")]


_LIMIT = re.compile(r"[a-z]{2,8}")
_LIMIT_VALUE = re.compile(r"(?:[0-9]{1,19}|infinity)(?::(?:[0-9]{1,19}|infinity))?")


def limit_properties(limits: object) -> list:
    """systemd-run's properties for the run's resource limits ([name, value] pairs the runner
    checked: distrun.planning.limits), where a login would have had the site's PAM limits."""
    if not isinstance(limits, list):
        raise CallError("launch: limits is not a list")
    out = []
    for pair in limits:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
                and _LIMIT.fullmatch(pair[0]) and _LIMIT_VALUE.fullmatch(pair[1])):
            raise CallError(f"launch: limit {pair!r} is not a name and a value")
        out += ["-p", f"Limit{pair[0].upper()}={pair[1]}"]
    return out


_RLIMITS = {"as": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE, "data": resource.RLIMIT_DATA,
            "fsize": resource.RLIMIT_FSIZE, "memlock": resource.RLIMIT_MEMLOCK, "nofile": resource.RLIMIT_NOFILE,
            "nproc": resource.RLIMIT_NPROC, "stack": resource.RLIMIT_STACK}


def set_limits(limits: list) -> str:
    """The same limits (checked by limit_properties) on this process, which the session's launch
    script inherits (no systemd): what went wrong, or empty."""
    for name, value in limits:
        soft, _, hard = value.partition(":")
        pair = tuple(resource.RLIM_INFINITY if v == "infinity" else int(v) for v in (soft, hard or soft))
        try:
            resource.setrlimit(_RLIMITS[name], pair)
        except KeyError:
            return f"{name} is not a resource limit"
        except (ValueError, OSError) as e:
            return (f"cannot set the {name} limit to {value} ({e}): lower distrun_unit_limits, "
                    "or let the connection be root")
    return ""


def launch(cfg: dict) -> dict:
    limits = limit_properties(cfg.get("limits", []))
    fence = gpu_fence(cfg.get("gpu_ids"))
    user = pwd.getpwnam(cfg["user"])
    script = os.path.join(cfg["dir"], cfg["script"])
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": "/bin/bash",
           "PATH": PATH if os.geteuid() == 0 else os.environ.get("PATH", PATH), "LANG": "C.UTF-8"}
    if _systemd():
        unit = unit_name(cfg)
        # Followers read the records as the training user: whatever root's umask (027, 077 on
        # hardened nodes), or they would take the exit code file the job writes instead.
        os.makedirs(RECORDS, mode=0o755, exist_ok=True)
        os.chmod(RECORDS, 0o755)
        tmp, done = record_path(unit, "exit.tmp"), record_path(unit, "exit")
        # systemd gives ExecStopPost how the main process ended; $$ is a literal $ in an Exec line.
        post = (f'+/bin/sh -c "umask 022; echo $$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS > {tmp} '
                f'&& mv -f {tmp} {done}"')
        argv = ["systemd-run", "--quiet", "--collect", f"--unit={unit}", f"--uid={user.pw_uid}",
                f"--gid={user.pw_gid}", "--description", f"distrun run {cfg['run']} attempt {cfg['attempt']}",
                "-p", "KillMode=control-group", "-p", f"TimeoutStopSec={STOP_S}", "-p", "SendSIGKILL=yes",
                "-p", "StandardInput=null", "-p", "StandardOutput=null", "-p", "StandardError=journal",
                "-p", f"ExecStopPost={post}", *runtime_private(user.pw_uid, user.pw_gid), *PRIVATE, *fence, *limits]
        env["XDG_RUNTIME_DIR"] = f"{RUNTIME}/{user.pw_uid}"
        argv += [f"--setenv={k}={v}" for k, v in env.items()]
        argv += ["/bin/bash", script]
        prune(RECORDS)
        # A unit's records from an earlier try of the same attempt would answer for this one.
        for kind in ("exit", "exit.tmp", "launched"):
            try:
                os.unlink(record_path(unit, kind))
            except FileNotFoundError:
                pass
        ran = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        if ran.returncode != 0:
            why = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
            return {"verb": "launch", "error": f"systemd-run could not start {unit}: {why[:300]}"}
        fd = os.open(record_path(unit, "launched"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, f"{unit}\n".encode())
        finally:
            os.close(fd)
        return {"verb": "launch", "launched": True, "unit": unit}
    if os.geteuid() not in (0, user.pw_uid):
        raise CallError(f"launch: running as uid {os.geteuid()}, neither root nor {user.pw_name}")
    problem = set_limits(cfg.get("limits", []))
    if problem:
        return {"verb": "launch", "error": f"{cfg['host']}: {problem}"}
    if os.geteuid() == user.pw_uid:  # root cannot look into a FUSE mount of the training user's
        run_dir = str(cfg.get("run_dir") or cfg["dir"])
        if not os.access(run_dir, os.R_OK | os.X_OK):
            return {"verb": "launch", "error": f"{cfg['host']}: cannot enter the run directory {run_dir} as user "
                                               f"{user.pw_name} (is the shared folder mounted, and is it the training user's?)"}
        if not os.path.isfile(script):
            return {"verb": "launch", "error": f"{cfg['host']}: there is no launch script {script}"}
    sys.stdout.flush()
    if os.fork() == 0:  # the launch script leads a session of its own, as the training user
        try:
            os.setsid()
            if os.geteuid() == 0:
                os.initgroups(user.pw_name, user.pw_gid)
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
            os.chdir(cfg["dir"])
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve("/bin/bash", ["bash", cfg["script"]], env)
        finally:
            os._exit(127)
    return {"verb": "launch", "launched": True, "unit": ""}


def main(argv: list[str]) -> int:
    return serve("launch.py", {"launch": launch}, argv, check_attempt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
