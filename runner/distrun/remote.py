"""A shell on the head node, the way Ansible reaches it, for following a run's output live.

Ansible returns a task's output only when the task ends; a training run lasts hours, so the
runner keeps one ssh session (or a local shell) open to the head and tails the launcher's log.
"""

from __future__ import annotations

import shlex

from .errors import UserError
from .inventory import Node


def shell_argv(node: Node, command: str) -> list[str]:
    hv = node.hostvars
    connection = node.connection
    if connection == "local":
        return ["bash", "-c", command]
    if connection not in ("ssh", "smart", "paramiko", "paramiko_ssh"):
        raise UserError(
            f"host {node.name}: ansible_connection={connection} cannot stream live output; "
            "use ssh or local for the head node"
        )
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3"]
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if hv.get(key):
            argv += shlex.split(str(hv[key]))
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


def as_user(user: str, command: str) -> str:
    """command run by bash as user, whoever the connection logs in as.

    A run directory on sshfs, or on NFS with root_squash, is open to the training user only:
    the launchers run as that user (Ansible's become), and so must every shell that reads it.
    Logged in as that user: plain bash; as root: runuser; otherwise sudo without a password
    (the same right Ansible's become uses).
    """
    u = shlex.quote(user)
    c = shlex.quote(command)
    return (
        f'if [ "$(id -un)" = {u} ]; then exec bash -c {c}; '
        f'elif [ "$(id -u)" = 0 ]; then exec runuser -u {u} -- bash -c {c}; '
        f"else exec sudo -n -u {u} -- bash -c {c}; fi"
    )
