"""Inventory values that are Jinja templates (``ansible_host: "{{ subnet }}.11"``,
``slots: "{{ gpus_per_node }}"``), rendered the way Ansible renders them before the runner reads
them: ``ansible-inventory --list`` gives them as written, while every play sees their value.

Only the values the runner itself reads are rendered (the connection's host, port and user,
``slots``, and the ``distrun_*``, ``slurm_*`` and ``mpi_env_*`` scalars), each with its host's
variables, through Ansible's own templar (imported only when an inventory has a template). A
value whose template names what only a node knows (a fact) cannot be rendered before distrun
reaches it: for a value the cluster's shape depends on, that is one line naming the host, the
value and the fix; any other stays as written, for Ansible to render in the play.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError

# What the runner reads of a host, beside the contract's prefixes.
_KEYS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_user", "slots")
_PREFIXES = ("distrun_", "slurm_", "mpi_env_")
# Values the cluster's shape rests on: one that cannot be rendered is refused.
_NEEDED = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_user", "slots", "distrun_user",
           "distrun_shared_dir", "distrun_mpi_provider", "distrun_iface")
_TEMPLATE = re.compile(r"\{\{|\{%")
# A template that reads something outside the inventory's files: its answer is not kept.
_OUTSIDE = re.compile(r"\b(lookup|query|q|now)\s*\(")


def is_template(value: object) -> bool:
    return isinstance(value, str) and _TEMPLATE.search(value) is not None


def _wanted(key: str, value: object) -> bool:
    return (key in _KEYS or key.startswith(_PREFIXES)) and is_template(value)


def render(path: Path, data: MutableMapping[str, Any]) -> bool:
    """Render, in place, the templated values the runner reads in ``ansible-inventory --list``'s
    answer ``data``; True when a template read something the files do not hold (a lookup)."""
    hostvars: Mapping[str, MutableMapping[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    todo = {h: [k for k, v in hv.items() if _wanted(k, v)] for h, hv in hostvars.items()}
    if not any(todo.values()):
        return False
    from ansible.template import Templar, trust_as_template

    groups = _groups(data)
    outside = False
    for host, keys in todo.items():
        if not keys:
            continue
        hv = hostvars[host]
        variables = {k: trust_as_template(v) if is_template(v) else v for k, v in hv.items()}
        variables.update(inventory_hostname=host, groups=groups,
                         group_names=sorted(g for g, members in groups.items() if host in members and g != "all"))
        templar = Templar(loader=None, variables=variables)
        for key in keys:
            text = hv[key]
            outside = outside or _OUTSIDE.search(text) is not None
            try:
                hv[key] = templar.template(trust_as_template(text))
            except Exception as exc:  # noqa: BLE001 - Ansible's template errors have no one base class
                if key in _NEEDED:
                    why = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
                    raise InventoryError(
                        f"inventory {path}: host {host} has {key}={text!r}, a template distrun cannot render before "
                        f"it reaches the node ({why}); give the value itself, or a variable the inventory sets"
                    ) from None
    return outside


def _groups(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each group's hosts, its children's included (the 'groups' variable of a play)."""
    out: dict[str, list[str]] = {}
    for group in data:
        if group.startswith("_"):
            continue
        seen: dict[str, None] = {}
        pending, visited = [group], set()
        while pending:
            g = pending.pop()
            if g in visited:
                continue
            visited.add(g)
            entry = data.get(g) or {}
            seen.update(dict.fromkeys(entry.get("hosts", [])))
            pending += entry.get("children", [])
        out[group] = list(seen)
    return out
