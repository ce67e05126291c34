"""Which GPUs each rank of a run gets: a node's selection (``--gpus N``: its first N; ``--hosts
node1:0,1``: those; by default every GPU the node declares) spread over the ranks the node runs.

With one GPU per rank (as many selected as the node has slots) every rank of the node sees the
node's selection and ``cuda:LOCAL_RANK`` is its own GPU, the i-th of the list (DeepSpeed's
launcher does the same, and torch programs call ``torch.cuda.set_device(LOCAL_RANK)``). With k
GPUs per rank (k times the slots selected) each rank sees only its own k, ``cuda:0`` to
``cuda:k-1``. Indices are nvidia-smi's (``CUDA_DEVICE_ORDER=PCI_BUS_ID``). The plan carries the
result per host (``RankHost.gpu_ids``, ``rank_gpus``, ``visible``); the rank wrapper and the
container's start only apply it. A launcher whose scheduler picks the GPUs (Slurm) gets their
count alone, and its ranks see what the scheduler gives them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from distrun.errors import PlanError
from distrun.inventory.cluster import Node

ORDER = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # indices as nvidia-smi and the CDI names number GPUs


@dataclass(frozen=True)
class Asked:
    """What the command line selected: ``--gpus N`` (None: every declared GPU) and the indices
    ``--hosts`` named per host."""

    count: int | None = None
    ids: Mapping[str, tuple[int, ...]] | None = None

    @property
    def chosen(self) -> bool:
        return self.count is not None or bool(self.ids)


@dataclass(frozen=True)
class HostGpus:
    """One host's part of the mapping, as the plan carries it."""

    gpu_ids: tuple[int, ...] = ()  # the node's GPUs the run uses, in selection order
    rank_gpus: tuple[tuple[int, ...], ...] = ()  # each local rank's own GPUs
    visible: tuple[str, ...] = ()  # each local rank's CUDA_VISIBLE_DEVICES; () leaves the node's as it is


def selection(node: Node, asked: Asked, source: object, *, scheduler_picks: bool = False) -> tuple[int, ...]:
    """The node's GPUs this run uses, or one line naming the flag, the host and the fix."""
    named = (asked.ids or {}).get(node.name)
    where = f"in inventory {source}"
    if named is not None:
        said = f"--hosts {node.name}:{','.join(map(str, named))}"
        if scheduler_picks:
            raise PlanError(f"{said}: the scheduler chooses which of a node's GPUs a job gets; give their count "
                            f"instead (--gpus {len(named)})")
        if not node.gpus:
            raise PlanError(f"{said}: {node.name} declares no GPU {where}; set gpus: N for {node.name} there, "
                            f"or name it without GPUs (--hosts {node.name})")
        over = [i for i in named if i >= node.gpus]
        if over:
            raise PlanError(f"{said}: {node.name} has {node.gpus} GPU(s) {where}, so no GPU {over[0]}; name GPUs 0 to "
                            f"{node.gpus - 1} (or set gpus: N for {node.name} there if it has more)")
        return named
    if asked.count is None:
        return tuple(range(node.gpus))
    if asked.count and not node.gpus:
        raise PlanError(f"--gpus {asked.count}: {node.name} declares no GPU {where}; set gpus: N for {node.name} "
                        f"there, or leave it out (--exclude {node.name})")
    if asked.count > node.gpus:
        raise PlanError(f"--gpus {asked.count}: {node.name} has {node.gpus} GPU(s) {where}; give --gpus "
                        f"{node.gpus} or less")
    return tuple(range(asked.count))


def per_rank(node: Node, gpu_ids: tuple[int, ...], source: object, *, scheduler_picks: bool = False) -> int:
    """How many GPUs each of the node's ranks gets (its slots share the selection evenly), 0
    where the node has none selected; one line naming the host and the fix where they cannot. A
    scheduler's ranks see all of a node's GPUs it gives: several per rank only with one rank there."""
    if not gpu_ids:
        return 0
    slots = node.slots
    k, rest = divmod(len(gpu_ids), slots)
    if k and not rest and not (scheduler_picks and k > 1 and slots > 1):
        return k
    said = f"{node.name}: {len(gpu_ids)} GPU(s) selected ({','.join(map(str, gpu_ids))}) for {slots} rank(s) (slots={slots})"
    if scheduler_picks:
        raise PlanError(f"{said}; the scheduler gives every rank of a node all its GPUs: give --gpus {slots} (one "
                        f"per rank), or set slots=1 for {node.name} in inventory {source} (one rank with them all)")
    if len(gpu_ids) > slots:
        fix = f"--gpus {slots}, or --hosts {node.name}:{','.join(map(str, gpu_ids[:slots]))}"
    else:
        fix = f"--gpus {slots} where it has them, or set slots={len(gpu_ids)} for {node.name} in inventory {source}"
    raise PlanError(f"{said}; select one GPU per rank or the same whole number for each ({fix})")


def host_gpus(node: Node, placed: int, asked: Asked, source: object, *, scheduler_picks: bool = False,
              lenient: bool = False) -> HostGpus:
    """The mapping of one host's ``placed`` ranks. ``lenient`` (--allow-gpu-mismatch with nothing
    selected): a selection the slots cannot share leaves the node's GPUs as they are."""
    gpu_ids = selection(node, asked, source, scheduler_picks=scheduler_picks)
    if scheduler_picks:
        try:
            per_rank(node, gpu_ids, source, scheduler_picks=True)
        except PlanError:
            if not (lenient and not asked.chosen):
                raise
        return HostGpus(gpu_ids=gpu_ids)
    if not gpu_ids:
        # A node with GPUs the run leaves unused (--gpus 0): its ranks see none.
        return HostGpus(visible=("",) * placed) if node.gpus else HostGpus()
    try:
        k = per_rank(node, gpu_ids, source)
    except PlanError:
        if lenient and not asked.chosen:
            return HostGpus()
        raise
    own = tuple(gpu_ids[i * k:(i + 1) * k] for i in range(placed))
    if k == 1:
        visible = (",".join(map(str, gpu_ids)),) * placed
    else:
        visible = tuple(",".join(map(str, g)) for g in own)
    return HostGpus(gpu_ids=gpu_ids, rank_gpus=own, visible=visible)


def in_container(visible: str, devices: tuple[int, ...]) -> str:
    """CUDA_VISIBLE_DEVICES inside a container given ``devices`` (nvidia-smi indices): there its
    GPUs are numbered from 0 in bus order, so each index becomes its place among the devices."""
    order = sorted(devices)
    return ",".join(str(order.index(int(g))) for g in visible.split(",") if g != "")


def first_free_at_launch(nodes: Iterable[Node], count: int | None, named: Iterable[str], *,
                         allow_concurrent: bool = False) -> list[str]:
    """The nodes where ``--gpus N`` leaves the choice to the launch: more GPUs than N and no
    indices named for them, in a run that claims GPUs. train asks each one's claim which GPUs no
    run holds and takes the first N of those; a plan made without asking (the dry run) shows the
    first N."""
    named = set(named)
    if not count or allow_concurrent:
        return []
    return [n.name for n in nodes if n.gpus > count and n.name not in named]
