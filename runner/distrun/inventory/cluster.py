"""The cluster as the inventory describes it, read through Ansible itself and checked.

Every inventory form Ansible accepts (YAML, INI, directories with group_vars, plugins) works,
because we ask ``ansible-inventory --list`` (``inventory_read``) instead of parsing files ourselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError
from distrun.inventory import contract, rules, slurm_site
from distrun.inventory import people as people_rules
from distrun.inventory import read as inventory_read
from distrun.inventory.values import check_address, check_duplicates, check_host_name, check_slots, check_values


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    slots: int
    slots_source: str  # "inventory", "gpus" or "default": shown by dry-run so users see why
    gpus: int  # the inventory's ``gpus``, else the count role mpi_env detected
    is_head: bool
    is_worker: bool
    hostvars: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def connection(self) -> str:
        return str(self.hostvars.get("ansible_connection", "ssh"))

    @property
    def iface(self) -> str | None:
        value = self.hostvars.get("distrun_iface")
        return str(value) if value else None


@dataclass(frozen=True)
class Cluster:
    source: Path
    head: Node
    workers: tuple[Node, ...]  # rank hosts: the head first when it is a worker, then by name
    user: str
    shared_dir: str
    mpi_provider: str
    env_prefix: str
    mpi_prefix: str  # Open MPI's installation: mpirun's --prefix
    group_vars: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    # A site distrun does not administer, by the name of its scheduler ("slurm": slurm_site), or None:
    # the head is its login node, the only host distrun reaches; workers are its compute nodes.
    site: str | None = None
    # MCA parameters that keep a run's Open MPI to its installation's own files (_openmpi_params).
    openmpi_params: tuple[tuple[str, str], ...] = ()
    # One account per person (distrun_users), or None: every run shares the training account.
    people: people_rules.People | None = None
    # With people: the person this process acts as (inventory.identity.as_person), else None.
    person: Any = None

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every host distrun reaches, once: head first, then the workers."""
        rest = tuple(n for n in self.workers if n.name != self.head.name and not self.site)
        return (self.head, *rest)

    @property
    def has_people(self) -> bool:
        """Whether every run is its person's (distrun_users): root's node programs are reached
        through the installed entry point (transport.remote.node_command)."""
        return self.people is not None

    @property
    def shared_fs_mode(self) -> str:
        """How the shared folder is shared (distrun_shared_fs_mode; sync when unset)."""
        return str(self.group_vars.get("distrun_shared_fs_mode", "sync"))

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.workers)


def _group_hosts(data: Mapping[str, Any], group: str) -> list[str]:
    """Hosts of a group including those of its child groups."""
    seen: dict[str, None] = {}  # ordered and O(1) membership: inventories reach thousands of hosts
    pending = [group]
    visited: set[str] = set()
    while pending:
        g = pending.pop()
        if g in visited:
            continue
        visited.add(g)
        entry = data.get(g) or {}
        for h in entry.get("hosts", []):
            seen.setdefault(h, None)
        pending.extend(entry.get("children", []))
    return list(seen)


def _slots(path: Path, host: str, hv: Mapping[str, Any], gpus: int) -> tuple[int, str]:
    try:
        return rules.slots(hv.get("slots"), gpus)
    except ValueError as exc:
        raise InventoryError(f"inventory {path}: host {host} has {exc}") from None


def _mpi_prefix(provider: str, env_prefix: str, head_facts: Mapping[str, Any] | None) -> str:
    """Open MPI's prefix: what role mpi_env recorded on the head for this provider and env, else
    the rule for the provider with the distro's prefix of the head's OS family (Debian's when no
    facts were gathered yet)."""
    fact = rules.local_fact(head_facts)
    if fact.get("mpi_prefix") and fact.get("provider") == provider and fact.get("env_prefix") == env_prefix:
        return str(fact["mpi_prefix"])
    family = str((head_facts or {}).get("ansible_os_family") or "Debian")
    return rules.mpi_prefix(provider, env_prefix, contract.distro_mpi_prefix(family))


def _openmpi_params(provider: str, env_prefix: str, head_facts: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The MCA parameters that keep a run's Open MPI to its installation's files
    (rules.openmpi_own_params), from the folders role mpi_env recorded on the head for this env
    (ompi_info's); none before setup recorded them (a plan made without facts)."""
    fact = rules.local_fact(head_facts)
    if fact.get("provider") != provider or fact.get("env_prefix") != env_prefix:
        return ()
    return rules.openmpi_own_params(str(fact.get("openmpi_sysconfdir") or ""), str(fact.get("openmpi_pkglibdir") or ""))


def load_facts(cache_dir: Path | None, host: str) -> dict[str, Any] | None:
    """Facts Ansible cached for a host (jsonfile cache), or None: plans never contact nodes.

    ansible-core 2.19 (the release distrun requires) names the files ``s1_<host>`` and wraps the
    facts in ``__payload__``.
    """
    if cache_dir is None:
        return None
    f = cache_dir / f"s1_{host}"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
        if isinstance(data, dict) and isinstance(data.get("__payload__"), str):
            data = json.loads(data["__payload__"])
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def cluster_from_json(path: Path, data: Mapping[str, Any], fact_cache: Path | None = None) -> Cluster:
    hostvars: Mapping[str, Mapping[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    groups = {k for k in data if k not in ("_meta", inventory_read.CONTRACT_PROBLEMS)}
    heads = _group_hosts(data, contract.HEAD_GROUP) if contract.HEAD_GROUP in groups else []
    if not heads:
        raise InventoryError(
            f"inventory {path}: no host in group '{contract.HEAD_GROUP}'; "
            f"add a [{contract.HEAD_GROUP}] group with exactly one host (the node that launches jobs)"
        )
    if len(heads) > 1:
        raise InventoryError(
            f"inventory {path}: group '{contract.HEAD_GROUP}' has {len(heads)} hosts ({', '.join(heads)}); "
            "keep exactly one head node"
        )
    workers = _group_hosts(data, contract.WORKER_GROUP) if contract.WORKER_GROUP in groups else []
    hv_head = hostvars.get(heads[0], {})
    existing = slurm_site.existing(hv_head)
    if existing:
        slurm_site.check_inventory(path, heads[0], workers, hv_head, check_host_name)
        workers = []
    elif not workers:
        raise InventoryError(
            f"inventory {path}: no host in group '{contract.WORKER_GROUP}'; "
            f"list the hosts that run ranks under [{contract.WORKER_GROUP}] (the head may be one of them)"
        )
    head_name = heads[0]
    ordered = rules.rank_order(workers, head_name)
    worker_set = set(workers)

    def make(name: str) -> Node:
        hv = hostvars.get(name, {})
        check_host_name(path, name)
        check_address(path, name, str(hv.get("ansible_host") or name))
        check_values(path, name, hv)
        try:
            gpus = rules.gpus(load_facts(fact_cache, name), hv)
        except ValueError as exc:
            raise InventoryError(f"inventory {path}: host {name} has {exc}") from None
        slots, source = _slots(path, name, hv, gpus)
        check_slots(path, name, slots)
        return Node(
            name=name,
            address=str(hv.get("ansible_host") or name),
            slots=slots,
            slots_source=source,
            gpus=gpus,
            is_head=name == head_name,
            is_worker=name in worker_set,
            hostvars=hv,
        )

    nodes = {name: make(name) for name in dict.fromkeys([head_name, *ordered])}
    check_duplicates(path, nodes)
    if existing:
        compute = slurm_site.compute_nodes(path, hv_head)
        nodes.update({c.name: Node(c.name, c.address, c.slots, c.slots_source, c.gpus, False, True) for c in compute})
        ordered = [c.name for c in compute]
    provider = str(hv_head.get("distrun_mpi_provider") or contract.default("distrun_mpi_provider"))
    providers = contract.choices("distrun_mpi_provider")
    if provider not in providers:
        raise InventoryError(f"inventory {path}: distrun_mpi_provider={provider!r}; choose one of {', '.join(providers)}")
    shared_dir = str(hv_head.get("distrun_shared_dir") or contract.default("distrun_shared_dir"))
    if not shared_dir.startswith("/"):
        raise InventoryError(f"inventory {path}: distrun_shared_dir={shared_dir!r} must be an absolute path")
    env_prefix = str(hv_head.get("distrun_env_prefix") or contract.env_prefix_default(provider))
    user = str(hv_head.get("distrun_user") or contract.default("distrun_user"))
    # Before the contract's own check, which would say less about an entry of the list.
    persons = people_rules.read(path, hv_head, str(hv_head.get("distrun_shared_fs_mode", "sync")), user)
    bad = data.get(inventory_read.CONTRACT_PROBLEMS) or []
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InventoryError(f"inventory {path}: {bad[0]}{more}; correct it where the inventory sets it")
    head_facts = load_facts(fact_cache, head_name)
    mpi_prefix = _mpi_prefix(provider, env_prefix, head_facts)
    return Cluster(
        source=path,
        head=nodes[head_name],
        workers=tuple(nodes[n] for n in ordered),
        user=user,
        shared_dir=shared_dir,
        mpi_provider=provider,
        env_prefix=env_prefix,
        mpi_prefix=mpi_prefix,
        group_vars=hv_head,
        site=slurm_site.SCHEDULER if existing else None,
        openmpi_params=_openmpi_params(provider, env_prefix, head_facts),
        people=persons,
    )


def load_cluster(path: Path, fact_cache: Path | None = None, *, admin: bool = False) -> Cluster:
    """The inventory's cluster. With people (distrun_users) as the person this process acts as
    (inventory.identity): every verb's but setup's and init's (``admin``), which act as the
    inventory's own connection."""
    from distrun.inventory import identity

    cluster = cluster_from_json(path, inventory_read.read_inventory_json(path), fact_cache)
    return cluster if admin else identity.as_person(cluster)


def render_hostfile(cluster: Cluster) -> str:
    """Open MPI / DeepSpeed hostfile: ``host slots=N``, head first, every host once."""
    return rules.hostfile((n.name, n.slots) for n in cluster.workers)
