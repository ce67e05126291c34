"""A Slurm cluster distrun does not administer: a site's Slurm as one of its users sees it.

An inventory with ``distrun_slurm_existing: true`` names the login node (group ``head``, the
only host distrun contacts), logs in there as the user (``ansible_user``), who is also the
training user (``distrun_user``), and never becomes root or anyone else (``ansible_become:
false``). The env is the user's own (``distrun_env_prefix``: a venv or conda env in their home
or on a shared path) and ``distrun_shared_dir`` a folder of theirs that the compute nodes mount.
The compute nodes belong to Slurm: named in ``slurm_nodelist`` (sbatch ``--nodelist``), or
counted in ``slurm_nodes`` and picked by Slurm; never contacted by distrun. Nothing on the
site is installed or changed: ``distrun setup`` refuses such an inventory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError, UserError
from distrun.inventory import rules

FLAG = "distrun_slurm_existing"
# Cluster.site of such an inventory: the name of the site's scheduler, whose launcher runs there.
SCHEDULER = "slurm"
# The compute nodes of a job when the inventory names none: placeholders Slurm fills in.
ANY_NODE = "slurm-any-"


def _true(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def existing(hostvars: Mapping[str, Any]) -> bool:
    """Does this (head's) hostvars describe a Slurm cluster distrun does not administer?"""
    return _true(hostvars.get(FLAG, False))


@dataclass(frozen=True)
class ComputeNode:
    name: str  # a node name from slurm_nodelist, or a placeholder (ANY_NODE + n) Slurm fills in
    slots: int  # ranks per node: slurm_tasks_per_node, else GPUs per node, else 1
    slots_source: str
    gpus: int

    @property
    def address(self) -> str:
        """Its name when the inventory names it; empty for a node Slurm picks."""
        return "" if self.name.startswith(ANY_NODE) else self.name


def _count(path: Path, hv: Mapping[str, Any], key: str, default: int, least: int) -> int:
    raw = hv.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw))
    except ValueError:
        value = least - 1
    if value < least:
        raise InventoryError(f"inventory {path}: {key}={raw!r}; set it to a whole number >= {least}")
    return value


def _nodelist(path: Path, hv: Mapping[str, Any]) -> list[str]:
    raw = hv.get("slurm_nodelist") or []
    names = [n.strip() for n in raw.split(",")] if isinstance(raw, str) else [str(n).strip() for n in raw]
    return [n for n in names if n]


def check_inventory(path: Path, head: str, workers: Sequence[str], hv: Mapping[str, Any],
                    check_name: Any) -> None:
    """Refuse an inventory that would make distrun reach more than the login node, or act as
    anyone but the user. ``check_name(path, name)`` is the inventory's own host-name rule."""
    others = [w for w in workers if w != head]
    if others:
        raise InventoryError(
            f"inventory {path}: {FLAG} is true, so distrun contacts only the login node ({head}, group head); "
            f"remove {', '.join(others)} from group workers and name compute nodes in slurm_nodelist "
            "(or give their number in slurm_nodes)"
        )
    if _true(hv.get("ansible_become", True)):
        raise InventoryError(
            f"inventory {path}: {FLAG} is true: set ansible_become: false in its group_vars, so no play "
            "becomes root or another user on a cluster you do not administer"
        )
    login = str(hv.get("ansible_user") or hv.get("ansible_ssh_user") or "")
    user = str(hv.get("distrun_user") or "")
    if not login or user != login:
        raise InventoryError(
            f"inventory {path}: {FLAG} is true: set ansible_user to your login on {head} and distrun_user to "
            f"the same name (now ansible_user={login or 'unset'}, distrun_user={user or 'unset'}); jobs run as you"
        )
    for name in _nodelist(path, hv):
        check_name(path, name)


def compute_nodes(path: Path, hv: Mapping[str, Any]) -> list[ComputeNode]:
    """The nodes a job may take: slurm_nodelist, else slurm_nodes placeholders (default 1)."""
    gpus = _count(path, hv, "slurm_gpus_per_node", 0, 0)
    try:
        slots, source = rules.slots(hv.get("slurm_tasks_per_node"), gpus)
    except ValueError as exc:
        raise InventoryError(f"inventory {path}: slurm_tasks_per_node: {exc}") from None
    source = "slurm_tasks_per_node" if source == "inventory" else source
    names = _nodelist(path, hv)
    if not names:
        names = [f"{ANY_NODE}{i}" for i in range(1, _count(path, hv, "slurm_nodes", 1, 1) + 1)]
    return [ComputeNode(n, slots, source, gpus) for n in names]


def named(names: Sequence[str]) -> bool:
    """Are these real node names (slurm_nodelist), not placeholders Slurm fills in?"""
    return not any(n.startswith(ANY_NODE) for n in names)


def job_options(path: Path, hv: Mapping[str, Any]) -> dict[str, str]:
    """sbatch options only a site's Slurm needs (the Slurm launcher's settings): cpus per task."""
    cpus = _count(path, hv, "slurm_cpus_per_task", 0, 1)
    return {"cpus_per_task": str(cpus)} if cpus else {}


def refuse_setup(source: Path, is_existing: bool) -> None:
    """'distrun setup' on an existing Slurm: nothing to install, one line saying what to do."""
    if is_existing:
        raise UserError(
            f"inventory {source}: {FLAG} is true: distrun installs nothing on a Slurm cluster it does not "
            f"administer; run 'distrun check --inventory {source}' to verify your env, then "
            f"'distrun train --inventory {source} --launcher slurm'"
        )


def refuse_hostfile(source: Path, is_existing: bool) -> None:
    """'distrun hostfile' on an existing Slurm: Slurm places the ranks, so there is no MPI hostfile."""
    if is_existing:
        raise UserError(
            f"inventory {source}: {FLAG} is true: Slurm places the ranks there and there is no MPI hostfile; "
            f"'distrun train --inventory {source} --launcher slurm --dry-run' shows the job it would submit"
        )
