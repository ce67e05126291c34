"""Rank placement: ranks put on the workers' slots in hostfile order, and the rule that a node's
ranks share its GPUs evenly (one GPU per rank, or a whole number per rank: planning/gpus.py); a
worker whose GPUs its slots cannot share is refused unless allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distrun.errors import PlanError
from distrun.inventory.cluster import Cluster, Node


@dataclass(frozen=True)
class GpuSlotMismatch:
    host: str
    slots: int
    gpus: int

    def message(self) -> str:
        return f"{self.host} has slots={self.slots} but {self.gpus} GPU(s), which {self.slots} rank(s) cannot share evenly"


def gpu_slot_mismatches(nodes: Sequence[Node]) -> list[GpuSlotMismatch]:
    """Workers with GPUs (declared, or fact ``gpus``) that their slots cannot share evenly.

    One rank per GPU, or the same whole number of GPUs per rank; other counts leave GPUs idle or
    put two ranks on one GPU. Nodes without a GPU are never a mismatch (CPU ranks, or facts not
    gathered yet).
    """
    return [GpuSlotMismatch(n.name, n.slots, n.gpus) for n in nodes if n.is_worker and n.gpus > 0 and n.gpus % n.slots]


def check_gpu_slots(cluster: Cluster, allow: bool = False) -> None:
    """Refuse a launch on a GPU/slot mismatch unless the user allowed it (--allow-gpu-mismatch)."""
    bad = gpu_slot_mismatches(cluster.workers)
    if bad and not allow:
        first = bad[0]
        more = f" (and {', '.join(m.host for m in bad[1:])})" if len(bad) > 1 else ""
        raise PlanError(
            f"{first.message()}{more}; set slots={first.gpus} for {first.host} in {cluster.source} "
            "(or remove 'slots' to use the GPU count), select GPUs for its ranks (--gpus N), "
            "or pass --allow-gpu-mismatch to launch anyway"
        )


def allocate(cluster: Cluster, np: int | None) -> list[tuple[str, int]]:
    """Place ``np`` ranks on the workers in hostfile order, filling each host's slots."""
    total = cluster.total_slots
    if np is None:
        np = total
    if np < 1:
        raise PlanError(f"--np {np}: a job needs at least 1 rank")
    if np > total:
        detail = ", ".join(f"{n.name}={n.slots}" for n in cluster.workers)
        raise PlanError(
            f"--np {np} is more than the {total} slots in {cluster.source} ({detail}); "
            "lower --np or raise 'slots' on the workers"
        )
    placed: list[tuple[str, int]] = []
    left = np
    for node in cluster.workers:
        take = min(node.slots, left)
        if take:
            placed.append((node.name, take))
        left -= take
    return placed
