"""Which of the inventory's workers one run uses: ``--hosts a,b`` keeps those, ``--exclude c``
leaves those out (DeepSpeed's --include/--exclude), and ``--hosts a:0,1,b:2,3`` names the GPUs of
each host too (nvidia-smi's indices; planning/gpus.py places the ranks on them). The result is a
cluster whose workers are the chosen ones, so the plan, the hostfile, the world size and the
preflight all follow; the head stays the head (it still stages the run and runs --prepare)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from distrun.errors import PlanError
from distrun.inventory.cluster import Cluster


def host_gpus(values: Iterable[str], flag: str = "--hosts") -> tuple[tuple[str, tuple[int, ...] | None], ...]:
    """'a,b', 'a:0,1,b:2,3' and repeated options alike: each host once, in the order given, with the
    GPU indices named after it (None where none are). After 'a:0' a bare number is a further GPU of
    a (host names are never numbers there). PlanError: one line naming the item and the fix."""
    hosts: dict[str, tuple[int, ...] | None] = {}
    current: str | None = None
    for word in (w.strip() for v in values for w in v.split(",")):
        if not word:
            continue
        if current is not None and word.isdigit():
            hosts[current] = (*(hosts[current] or ()), _index(flag, current, word))
            continue
        name, colon, first = word.partition(":")
        name = name.strip()
        if colon and flag != "--hosts":
            raise PlanError(f"{flag} {word}: {flag} takes host names only; leave out GPUs by naming the others "
                            f"(--hosts {name}:0,1)")
        if colon and not name:
            raise PlanError(f"{flag} {word}: no host before ':'; write the host, then its GPUs (--hosts node1:0,1)")
        if colon and hosts.get(name):
            raise PlanError(f"{flag} {word}: {name}'s GPUs are named twice; name them once ({flag} {name}:0,1)")
        hosts[name] = (_index(flag, name, first.strip()),) if colon else hosts.get(name)
        current = name if colon else None
    for name, ids in hosts.items():
        twice = sorted({i for i in ids or () if (ids or ()).count(i) > 1})
        if twice:
            raise PlanError(f"{flag} {name}:{','.join(map(str, ids or ()))}: GPU {twice[0]} of {name} is named twice; "
                            "name each GPU once")
    return tuple(hosts.items())


def _index(flag: str, host: str, text: str) -> int:
    if not text.isdigit():
        said = f"{text!r} is not a GPU index" if text else f"no GPU index after '{host}:'"
        raise PlanError(f"{flag} {host}:{text}: {said}; write nvidia-smi's indices after the host ({flag} {host}:0,1) "
                        "or the host alone")
    return int(text)


def host_names(values: Iterable[str], flag: str = "--hosts") -> tuple[str, ...]:
    """'a,b' and repeated options alike: the names, each once, in the order given (without the GPUs
    ``host_gpus`` reads)."""
    return tuple(name for name, _ in host_gpus(values, flag))


def _check(cluster: Cluster, flag: str, names: tuple[str, ...]) -> None:
    every = {n.name for n in cluster.nodes}
    workers = [n.name for n in cluster.workers]
    for name in names:
        if name not in every:
            raise PlanError(f"{flag} {name}: no such host in inventory {cluster.source} "
                            f"(its hosts: {', '.join(n.name for n in cluster.nodes)})")
        if name not in workers:
            raise PlanError(f"{flag} {name}: {name} runs no ranks in inventory {cluster.source} "
                            f"(it is not in group 'workers': {', '.join(workers)})")


def select(cluster: Cluster, hosts: Iterable[str] = (), exclude: Iterable[str] = ()) -> Cluster:
    """The cluster with only the chosen workers (rank order kept), or itself when none is named."""
    keep, drop = host_names(hosts), host_names(exclude)
    if not keep and not drop:
        return cluster
    _check(cluster, "--hosts", keep)
    _check(cluster, "--exclude", drop)
    chosen = tuple(n for n in cluster.workers if (not keep or n.name in keep) and n.name not in drop)
    if not chosen:
        asked = " ".join(f"{flag} {','.join(v)}" for flag, v in (("--hosts", keep), ("--exclude", drop)) if v)
        raise PlanError(f"{asked} leaves no host to run ranks on in inventory {cluster.source}; keep at least one "
                        f"of {', '.join(n.name for n in cluster.workers)}")
    return dataclasses.replace(cluster, workers=chosen)


def without_drained(cluster: Cluster, drained: Mapping[str, str], hosts: Iterable[str] = ()) -> tuple[Cluster, list[str]]:
    """The cluster without its drained workers (``drained``: node -> the line that says why and how
    it comes back), and those lines for the nodes left out. A drained node named in ``--hosts`` is
    refused rather than dropped: the run asked for it by name. The head stays the head (it stages
    the run and runs no ranks once left out of the workers)."""
    asked = host_names(hosts)
    named = [n for n in asked if n in drained]
    if named:
        raise PlanError(f"--hosts {named[0]}: {drained[named[0]]}; or leave it out of --hosts")
    gone = [n.name for n in cluster.workers if n.name in drained]
    if not gone:
        return cluster, []
    chosen = tuple(n for n in cluster.workers if n.name not in drained)
    if not chosen:
        raise PlanError(f"every worker of inventory {cluster.source} is drained: {drained[gone[0]]}"
                        + (f" (and {', '.join(gone[1:])})" if gone[1:] else ""))
    return dataclasses.replace(cluster, workers=chosen), [f"left out: {drained[n]}" for n in gone]
