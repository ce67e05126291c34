"""Who drives distrun, on a cluster with people (the inventory's distrun_users).

Every verb but ``setup`` (and ``init``) acts as the person at the controller: the name from
``DISTRUN_USER``, else this account's login name; their key from ``DISTRUN_SSH_KEY``, else ssh's
own defaults. The inventory's ``ansible_user`` and key are the admin's, for setup: a person's
verbs connect as the person (Ansible's extra vars, which win over inventory vars, and the same
hostvars for distrun's own ssh sessions), without become, and their run is theirs: its units run
as them and its folder is their own, ``<distrun_shared_dir>/people/<name>`` (role people makes it,
0700, theirs). A name the list does not hold is refused before any connection.

Without distrun_users nothing here applies: the cluster is read as the inventory says.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.errors import InventoryError
from distrun.inventory.people import USERS_VAR

if TYPE_CHECKING:
    from distrun.inventory.cluster import Cluster

USER_ENV = "DISTRUN_USER"
KEY_ENV = "DISTRUN_SSH_KEY"
# The hostvars that say how Ansible connects; a person's own values replace the inventory's.
_KEY_VARS = ("ansible_ssh_private_key_file", "ansible_private_key_file")
_USER_VARS = ("ansible_user", "ansible_ssh_user")


@dataclass(frozen=True)
class Identity:
    """The person a verb acts as: their name, their key (None: ssh's defaults), their folder."""

    name: str
    key: str | None
    folder: str

    def extravars(self) -> dict[str, Any]:
        """Ansible's extra vars for every playbook a person's verb runs: their login, their key
        (an empty one: ssh's own defaults), no become, the user and folder their run is theirs in."""
        # No login between the nodes is checked: a person has no mesh key (mpirun is refused), and
        # the launchers a person's run takes start on each host through the entry point.
        return {"ansible_user": self.name, "ansible_ssh_private_key_file": self.key or "",
                "ansible_private_key_file": self.key or "", "ansible_become": False,
                "distrun_user": self.name, "distrun_shared_dir": self.folder, "preflight_check_ssh_mesh": False}


# The person each inventory's verbs act as in this process (as_person), by the inventory's path:
# every playbook a person's verb runs on it gets their extra vars (playbook_vars).
_ACTING: dict[str, Identity] = {}


def _key(path: Path) -> str:
    try:
        return str(Path(path).resolve())
    except OSError:
        return str(path)


def playbook_vars(inventory: Path, playbook: str) -> dict[str, Any]:
    """The extra vars a playbook on ``inventory`` gets for the person this process acts as (none
    for setup, an admin's, or where the inventory lists no people)."""
    who = _ACTING.get(_key(inventory))
    return {} if who is None or playbook == "setup.yml" else who.extravars()


def person_folder(shared_dir: str, name: str) -> str:
    """A person's own folder in the shared folder: their runs' directories and checkpoints."""
    return f"{shared_dir.rstrip('/')}/people/{name}"


def login_name() -> str:
    """This controller account's login name (its uid's passwd entry, else $USER / $LOGNAME)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or os.environ.get("LOGNAME") or ""


def resolve(path: Path, names: tuple[str, ...], shared_dir: str, env: Mapping[str, str] | None = None) -> Identity:
    """The person this process acts as, checked against the inventory's list: an InventoryError in
    one line where the name is not in it."""
    env = os.environ if env is None else env
    asked = env.get(USER_ENV, "").strip()
    name = asked or login_name()
    if name not in names:
        came = f"{USER_ENV}={name}" if asked else f"your login name {name!r} ({USER_ENV} is not set)"
        raise InventoryError(f"inventory {path}: {came} is not in {USERS_VAR} ({', '.join(names)}); set {USER_ENV} "
                             f"to your name there, or ask an admin to add you to {USERS_VAR} and run distrun setup")
    key = env.get(KEY_ENV, "").strip() or None
    if key is not None:
        key = os.path.expanduser(key)
        if not os.path.isfile(key):
            raise InventoryError(f"inventory {path}: {KEY_ENV}={key} is not a file; point it at your private key, "
                                 "or unset it to use ssh's defaults")
    return Identity(name, key, person_folder(shared_dir, name))


def _hostvars(hv: Mapping[str, Any], who: Identity) -> dict[str, Any]:
    out = {k: v for k, v in hv.items() if k not in _KEY_VARS and k not in _USER_VARS}
    out["ansible_user"] = who.name
    if who.key:
        out["ansible_ssh_private_key_file"] = who.key
    out["distrun_user"] = who.name
    out["distrun_shared_dir"] = who.folder
    return out


def as_person(cluster: Cluster, env: Mapping[str, str] | None = None) -> Cluster:
    """The cluster as a person's verb reaches it: connected as them, with their key, their runs'
    user and folder theirs. ``cluster`` unchanged where the inventory lists no people."""
    if cluster.people is None:
        return cluster
    who = resolve(cluster.source, cluster.people.names, cluster.shared_dir, env)
    _ACTING[_key(cluster.source)] = who

    def node(n: Any) -> Any:
        return replace(n, hostvars=_hostvars(n.hostvars, who))

    nodes = {n.name: node(n) for n in (cluster.head, *cluster.workers)}
    return replace(cluster, head=nodes[cluster.head.name], workers=tuple(nodes[n.name] for n in cluster.workers),
                   user=who.name, shared_dir=who.folder, group_vars=_hostvars(cluster.group_vars, who), person=who)


# What a person's run cannot do yet, each with what to use instead.
_LAUNCHERS_NOT_YET = {
    "mpirun": "mpirun's daemons log in between the nodes, and a person has no mesh key of their own yet",
    "slurm": "Slurm's jobs run as the training account, not as the person",
}
USABLE_LAUNCHERS = ("torchrun", "ssh")


def refusal(launcher: str, image: bool) -> str | None:
    """The one line that refuses a person's run what a cluster with people cannot do as them yet
    (None where it can)."""
    if launcher in _LAUNCHERS_NOT_YET:
        return (f"--launcher {launcher} on a cluster with people ({USERS_VAR}): {_LAUNCHERS_NOT_YET[launcher]}; "
                f"use --launcher {' or --launcher '.join(USABLE_LAUNCHERS)}")
    if image:
        return (f"--image (or distrun_container_image) on a cluster with people ({USERS_VAR}): a person's containers "
                "are not yet started in units of their own; run without an image (unset distrun_container_image)")
    return None
