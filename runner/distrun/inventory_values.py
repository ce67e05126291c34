"""The inventory values that reach shells, ssh argv and #SBATCH lines, checked when the inventory
is loaded: one line naming the host, the value and the fix for a value that is not a name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import rules
from .errors import InventoryError

# Inventory values end up in generated shell scripts, ssh argv and #SBATCH lines. They are
# quoted there too; these rules keep a value that is not a name out of the cluster at load time.
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_DNS = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
_USER = re.compile(r"[a-z_][a-z0-9_-]*[$]?")
# A path, a Slurm partition or time limit: printable, no space, no shell metacharacter.
_WORD = re.compile(r"[A-Za-z0-9._:,/@%+=-]+")
# Values that reach a shell or an #SBATCH line, and the rule each must follow.
_HEAD_VALUES = {
    "distrun_user": (_USER, "a user name such as distrun"),
    "distrun_shared_dir": (_WORD, "an absolute path of letters, digits and ._-/"),
    "distrun_env_prefix": (_WORD, "an absolute path of letters, digits and ._-/"),
    "distrun_hostfile": (_WORD, "an absolute path of letters, digits and ._-/"),
    "slurm_partition": (_NAME, "a partition name of letters, digits and ._-"),
    "slurm_time_limit": (_WORD, "a Slurm time such as 30 or 1-00:00:00"),
    "slurm_mode": (_NAME, "single or multi-job"),
    "slurm_srun_mpi": (_NAME, "an srun --mpi type such as pmix"),
}


def _shown(value: object) -> str:
    # repr() keeps a newline or an escape on the one line of the error.
    return repr(str(value))


def check_host_name(path: Path, name: str) -> None:
    if not _NAME.fullmatch(name) or name.startswith("-"):
        raise InventoryError(
            f"inventory {path}: host name {_shown(name)} is not a plain name; use letters, digits and ._- "
            "(not starting with -) and put the address in ansible_host"
        )


def check_address(path: Path, host: str, address: str) -> None:
    """An IP address or a DNS name: never an ssh option, never shell text."""
    if rules.is_ip(address):
        return
    if address.startswith("-") or not _DNS.fullmatch(address):
        raise InventoryError(
            f"inventory {path}: host {host} has ansible_host={_shown(address)}; set it to an IP address or a DNS name"
        )


def check_values(path: Path, host: str, hv: Mapping[str, Any]) -> None:
    """Inventory values that land in generated scripts: one rule each (see _HEAD_VALUES)."""
    for key, (rule, what) in _HEAD_VALUES.items():
        value = hv.get(key)
        if value is None or value == "":
            continue
        text = str(value)
        if rule is _WORD and "\n" not in text and text.startswith("{{"):
            continue  # a template only Ansible renders (distrun_hostfile's default); quoted wherever it lands
        if not rule.fullmatch(text) or text.startswith("-"):
            raise InventoryError(f"inventory {path}: host {host} has {key}={_shown(text)}; set it to {what}")
    for key in ("distrun_iface", "ansible_user", "ansible_ssh_user"):
        value = hv.get(key)
        if value and (not _NAME.fullmatch(str(value)) or str(value).startswith("-")):
            raise InventoryError(
                f"inventory {path}: host {host} has {key}={_shown(value)}; use letters, digits and ._- only"
            )
