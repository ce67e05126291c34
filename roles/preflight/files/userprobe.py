# ruff: noqa: F821 - as_user_fs and FsUserError are distrun_fsuser.py's, ProbeConfig and Any (typing's, for
# annotations) probe_config.py's, both composed in front of this file
"""What root's preflight probe asks about the training user, and how, without believing any
process of that user's uid (a job of that user can trace any of them, or feed them through files it
writes, and make them say anything): root's own processes run what root records or decides on (the
env's Python, Open MPI's mpirun, ssh with root's node key); what the user may do (write the shared
folder, run a program, unpack the run's files) is asked by a forked root process that took only
that user's filesystem identity (user_files). Composed in front of the probe's checks; each
function here takes the probe's config (``ProbeConfig``), read once by probe.py, as its argument.
"""

import os
import pwd
import subprocess
from collections.abc import Callable


def last_line(text: str | None) -> str:
    """The last line of a program's output that says something, capped (for a detail)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _isolated_env(cfg: ProbeConfig) -> dict[str, str]:
    """The probe's own environment, reduced: its PATH (root's, behind the env's bin), HOME, LANG."""
    return {"HOME": os.environ.get("HOME", "/root" if os.geteuid() == 0 else "/"), "LANG": "C.UTF-8",
            "PATH": f"{cfg.prefix}/bin:" + os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")}


def run(cfg: ProbeConfig, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run argv as this probe (root, or the user where the connection is that user), in /, with a
    plain environment: root's own answer, never a process of the training user's."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd="/",
                              env=_isolated_env(cfg), stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout}s")


# The unit the user runtime runs in: a /tmp, /dev/shm, IPC and /run/user/<uid> of its own, so the
# pause process of rootless podman ends with it (distrun.planning.containers: the same, tested).
USER_UNIT_PROPERTIES = ("PrivateTmp=yes", "PrivateIPC=yes", "TemporaryFileSystem=/dev/shm:mode=1777,nosuid,nodev",
                        "ProtectProc=invisible", "TemporaryFileSystem=/run/user/{uid}:mode=0700,uid={uid},gid={gid}")


def user_unit_argv(pw: pwd.struct_passwd, env: dict, argv: list[str], timeout: float) -> list[str]:
    """argv as the user in a transient unit that ends with it, or ``timeout`` s after its start."""
    props = [w for p in USER_UNIT_PROPERTIES for w in ("-p", p.format(uid=pw.pw_uid, gid=pw.pw_gid))]
    return ["systemd-run", "--quiet", "--pipe", "--wait", "--collect", f"--uid={pw.pw_uid}", f"--gid={pw.pw_gid}",
            "--working-directory=/", *props, "-p", f"RuntimeMaxSec={int(timeout) + 5}", "-p", "KillMode=control-group",
            "-p", "SendSIGKILL=yes", *(f"--setenv={k}={v}" for k, v in env.items()), "--", *argv]


def as_user(cfg: ProbeConfig, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run argv as the training user (from root), or directly when we already are that user: only
    the container image's checks, whose runtime keeps its store in that user's home. The working
    directory is / (root's), never the user's home: a job can write its home. From root, with
    systemd: in a unit (user_unit_argv), which nothing it starts outlives."""
    user = cfg.user
    kwargs: dict = {"cwd": "/", "stdin": subprocess.DEVNULL}
    if os.geteuid() == 0 and user != "root":
        pw = pwd.getpwnam(user)
        env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user,
               "PATH": f"{cfg.prefix}/bin:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        if os.path.isdir("/run/systemd/system"):
            argv = user_unit_argv(pw, {**env, "XDG_RUNTIME_DIR": f"/run/user/{pw.pw_uid}"}, argv, timeout)
            kwargs["env"] = _isolated_env(cfg)
        else:
            kwargs.update({"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(user, pw.pw_gid),
                           "env": env})
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout}s")


def user_files(cfg: ProbeConfig, work: Callable[..., Any], *args: Any) -> Any:
    """work(*args) with the training user's rights on files: in a forked root process that took
    that user's filesystem identity (as_user_fs), or here where the probe already is that user.
    Its value, or FsUserError."""
    if os.geteuid() != 0 or cfg.user == "root":
        return work(*args)
    return as_user_fs(cfg.user, work, *args)


# Root's own logins as the training user: root's node key (root's alone, role ssh_mesh), which the
# user CA certified for every node, and root's own known_hosts.
NODE_KEY = "/etc/distrun/node_key"
ROOT_KNOWN_HOSTS = "/etc/distrun/known_hosts"


def login_argv(cfg: ProbeConfig, target: str) -> list[str]:
    """The login that proves the mesh: as the training user with a certificate of the user CA,
    running nothing on the target (-N; the master it becomes ends a second later). As root, with
    root's node key; where the probe already is the training user, with that user's own ssh."""
    if os.geteuid() == 0:
        ssh = ["ssh", "-F", "/etc/ssh/ssh_config", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", NODE_KEY,
               "-o", f"UserKnownHostsFile={ROOT_KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes"]
        login = f"{cfg.user}@{target}"
    else:
        ssh, login = list(cfg.user_ssh), target
    control = f"/tmp/distrun-login-{os.getpid()}-{os.urandom(4).hex()}"
    return [*ssh, "-o", f"ConnectTimeout={cfg.ssh_timeout}", "-N", "-f", "-o", "ControlMaster=yes",
            "-o", f"ControlPath={control}", "-o", "ControlPersist=1", "--", login]


def may_write(path: str) -> bool:
    return os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def new_file(path: str) -> bool:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.close(fd)
    return True


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def may_run(cfg: ProbeConfig, path: str) -> bool:
    """Whether the training user may run path (the kernel's answer, with that user's rights)."""
    try:
        return bool(user_files(cfg, _runnable, path))
    except FsUserError:
        return False


def stage_in_child(script: str, config: dict) -> dict:
    """The stage program (nodecommon.py + stage.py), run in this process: the forked root process
    that took the training user's filesystem identity."""
    namespace: dict = {"__name__": "distrun_stage"}
    exec(compile(script, "stage.py", "exec"), namespace)  # noqa: S102 - root's own program, sent with the probe
    try:
        return namespace["staged"](config)
    except namespace["StageError"] as exc:
        return {"error": str(exc)}
