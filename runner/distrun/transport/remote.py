"""A shell on a node, the way Ansible reaches it, for following a run's output live.

Ansible returns a task's output only when the task ends; a training run lasts hours, so the
runner keeps one ssh session (or a local shell) open to each node and tails the launcher's log.
Those sessions ride on the master connection Ansible keeps per node (ansible.cfg), so a run opens
one connection per node, not one per session.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from distrun import paths
from distrun.errors import UserError
from distrun.inventory.cluster import Node
from distrun.transport import nodeprog

# Seconds between ssh keepalives and how many may go unanswered before a node counts as lost
# (ansible.cfg gives Ansible's master connections the same).
KEEPALIVE_S = 5
KEEPALIVE_COUNT = 3


def _names_control_path(args: list[str]) -> bool:
    """Whether the inventory's own ssh arguments choose a control socket (-S, -o ControlPath)."""
    return any(a.startswith("-S") for a in args) or "controlpath" in " ".join(args).lower()


def shell_argv(node: Node, command: str, *, master: bool = False) -> list[str]:
    """ssh to node as Ansible reaches it, running command. The session rides on the master
    connection a playbook left open to the node (ansible.cfg: same socket name), else connects by
    itself; it never becomes a master, whose background process would hold its output open.
    ``master``: open the node's master instead (kept 60 s; its keepalives end every session on it
    when the node stops answering for 15 s), for callers that read nothing from it."""
    hv = node.hostvars
    connection = node.connection
    if connection == "local":
        return ["bash", "-c", command]
    if connection not in ("ssh", "smart", "paramiko", "paramiko_ssh"):
        raise UserError(
            f"host {node.name}: ansible_connection={connection} cannot stream live output; "
            "use ssh or local for the head node"
        )
    extra: list[str] = []
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if hv.get(key):
            extra += shlex.split(str(hv[key]))
    # ssh keeps the first value it is given for an option: these come before the inventory's.
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", f"ServerAliveInterval={KEEPALIVE_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}"]
    argv += ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s"] if master else ["-o", "ControlMaster=no"]
    if not _names_control_path(extra):
        argv += ["-o", f"ControlPath={paths.ssh_control_dir()}/%C"]
    argv += extra
    if hv.get("ansible_port"):
        argv += ["-p", str(hv["ansible_port"])]
    key_file = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    if key_file:
        argv += ["-i", str(key_file)]
    user = hv.get("ansible_user") or hv.get("ansible_ssh_user")
    target = f"{user}@{node.address}" if user else node.address
    # "--": a destination is never read as an option (an ansible_host of "-oProxyCommand=...").
    argv += ["--", target, command]
    return argv


def open_masters(nodes: Sequence[Node], wait_s: float = 3.0) -> None:
    """Open each node's master connection, all at once, and wait for them up to wait_s: the
    sessions and playbooks that follow ride on them instead of connecting one by one. Nothing is
    read from them: a node that cannot be reached is the preflight's to name, and a master still
    connecting after wait_s goes on in the background."""
    folder = paths.ssh_control_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    procs = []
    for node in nodes:
        if node.connection not in ("ssh", "smart"):
            continue
        procs.append(subprocess.Popen(shell_argv(node, "true", master=True), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
    deadline = time.monotonic() + wait_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            threading.Thread(target=proc.wait, daemon=True).start()  # reaped when it ends


@dataclass(frozen=True)
class Done:
    """How one host's command ended: its exit code and output (stdout and stderr together), or
    rc None and why when it could not start or did not end in time."""

    rc: int | None
    out: str = ""
    why: str = ""

    def last_line(self) -> str:
        """Why it did not start or end in time, else its last line of output, else its exit code."""
        lines = [ln.strip() for ln in self.out.splitlines() if ln.strip()]
        return self.why or (lines[-1] if lines else f"exit {self.rc}")


def run_each(nodes: Mapping[str, Node], commands: Mapping[str, str], timeout_s: float,
             inputs: Mapping[str, str] | None = None) -> dict[str, Done]:
    """Run each host's command on its node (shell_argv: over its ssh connection), all at once,
    each given timeout_s to end (killed after it); host -> how it ended. ``inputs``: a host's
    command reads its text on stdin (what must stay out of an argv); the others read nothing."""

    def one(host: str, command: str) -> Done:
        text = (inputs or {}).get(host)
        try:
            proc = subprocess.Popen(shell_argv(nodes[host], command),
                                    stdin=subprocess.PIPE if text is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        except (OSError, UserError) as exc:
            return Done(None, why=str(exc))
        try:
            out = proc.communicate(text, timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: a local shell's children too
            return Done(None, proc.communicate()[0], f"no answer in {timeout_s:.0f} s")
        return Done(proc.returncode, out)

    if not commands:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(commands))) as pool:
        futures = {h: pool.submit(one, h, c) for h, c in commands.items()}
    return {h: f.result() for h, f in futures.items()}


# bash as distrun starts it for the training user: it reads none of that user's startup files,
# which a job can write (bash reads ~/.bashrc for a command when it thinks sshd started it, as
# it does under root's ssh login through runuser: SSH_CLIENT stays set), nor $BASH_ENV.
USER_BASH = "env -u BASH_ENV -u ENV bash --norc --noprofile -c"


# ssh as distrun runs it for the training user on the nodes (mpirun's daemons, the sync mode's
# rsync, the preflight's logins): the system's client configuration only (root's
# /etc/ssh/ssh_config and the files it includes), never ~/.ssh/config, which a job can write and
# whose ProxyCommand or LocalCommand would run, in a later run or outside every unit.
USER_SSH = ("ssh", "-F", "/etc/ssh/ssh_config", "-o", "BatchMode=yes")


def run_ssh(key: str) -> tuple[str, ...]:
    """USER_SSH for a run's own logins: with the attempt's key, whose certificate (beside it)
    opens only the run's hosts, for minutes, and only distrun's relay. Where the run has no
    certificate (the connection to the head could not be root), ssh goes on with the user's own."""
    return (*USER_SSH, "-i", key)


def as_user(user: str, command: str) -> str:
    """command run by bash as user, whoever the connection logs in as.

    A run directory on sshfs, or on NFS with root_squash, is open to the training user only:
    the launchers run as that user (Ansible's become), and so must every shell that reads it.
    Logged in as that user: plain bash; as root: runuser; otherwise sudo without a password
    (the same right Ansible's become uses). A switched user starts in / (the login's folder is
    not the user's to read: rootless podman, for one, fails there), without the login's session
    variables, which name root's runtime folder and bus (runuser keeps them; podman would use
    them and fail). The user's startup files are never read (USER_BASH).
    """
    u = shlex.quote(user)
    c = shlex.quote(command)
    return (
        f'if [ "$(id -un)" = {u} ]; then exec {USER_BASH} {c}; '
        f'elif [ "$(id -u)" = 0 ]; then exec runuser -u {u} -- env -C / -u XDG_RUNTIME_DIR -u DBUS_SESSION_BUS_ADDRESS '
        f'{USER_BASH} {c}; '
        f"else exec sudo -n -u {u} -- env -C / {USER_BASH} {c}; fi"
    )


def as_root_or_user(user: str, command: str) -> str:
    """command run by bash as root where the connection can be root (logged in as root, or sudo
    without a password), else as user: the node programs contain a run in a unit only as root."""
    u = shlex.quote(user)
    # The command once, in a variable: a node program's text is tens of kilobytes, and the kernel
    # takes at most 128 KiB in one argument.
    return (
        f"c={shlex.quote(command)}; "
        'if [ "$(id -u)" = 0 ]; then exec bash -c "$c"; '
        'elif sudo -n true 2>/dev/null; then exec sudo -n -- bash -c "$c"; '
        f'elif [ "$(id -un)" = {u} ]; then exec {USER_BASH} "$c"; '
        f'else exec sudo -n -u {u} -- {USER_BASH} "$c"; fi'
    )


def node_command(user: str, verb: str, config: Mapping[str, Any], program: str = "node", *, people: bool = False) -> str:
    """The one way a run verb asks root's node program for verb on a node. A cluster with people
    (distrun_users): the installed root entry point through sudo (nodeprog.entry_command), which
    takes the caller from sudo; no program text a node runs as root travels. Otherwise the
    program's text, run as root where the connection can be root, else as user (as_root_or_user)."""
    if people:
        return nodeprog.entry_command(verb, dict(config), program)
    return as_root_or_user(user, nodeprog.command(verb, dict(config), program))


def root_or_person(user: str, command: str, *, people: bool) -> str:
    """A runtime's command for the user's own containers (planning/containers.in_user_unit: started
    by root in a unit of the user's own, else run as the user). A cluster with people: always as
    the person, with no unit (no root step of theirs travels but the entry point's; security.md
    says what that leaves); otherwise as root where the connection can be root (as_root_or_user)."""
    return as_user(user, command) if people else as_root_or_user(user, command)
