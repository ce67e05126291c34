"""Which of the inventory's workers one run uses: ``--hosts a,b`` keeps those, ``--exclude c``
leaves those out (DeepSpeed's --include/--exclude). The result is a cluster whose workers are
the chosen ones, so the plan, the hostfile, the world size and the preflight all follow; the
head stays the head (it still stages the run and runs --prepare)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from distrun.errors import PlanError
from distrun.inventory.cluster import Cluster


def host_names(values: Iterable[str]) -> tuple[str, ...]:
    """'a,b' and repeated options alike: the names, each once, in the order given."""
    return tuple(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))


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
