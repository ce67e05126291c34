"""What the user asked for a run, nested as the plan is (jobplan.py): the program every rank runs,
where the ranks go, how they are launched, and the run's policy (preflight, restarts, detach,
sharing hosts). The command line fills one ``JobRequest`` (cli/train.py), ``plan.build_plan``
reads it, and the run (run/train.py) follows its policy; no layer re-lists its fields.

Also the cluster a request runs on (``load``: the inventory with --hosts/--exclude applied, less its
drained workers) and every variable of its ranks' env.sh (``environment``), computed once per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from distrun import paths
from distrun.inventory import contract
from distrun.inventory.cluster import Cluster, load_cluster
from distrun.planning.jobenv import run_env
from distrun.planning.selection import select, without_drained


@dataclass(frozen=True)
class ProgramRequest:
    """What every rank runs: a reference workload, a --script, or a --workdir project's command."""

    workload: str = "gcn"
    script: Path | None = None  # --script, on this machine
    args: tuple[str, ...] = ()  # after --: the program's arguments, or with --workdir the command itself
    dataset: str = "synthetic"
    data_dir: str | None = None
    epochs: int | None = None
    gdc: tuple[float, int] | None = None  # --use-gdc: (alpha, top-k) for the reference workloads
    workdir: Path | None = None  # --workdir, on this machine
    prepare: tuple[str, ...] = ()  # --prepare, split into words
    env: Mapping[str, str] = field(default_factory=dict)  # --env: values that never enter the plan


@dataclass(frozen=True)
class PlacementRequest:
    """Where the ranks go and how they find each other."""

    np: int | None = None  # None: every slot of the chosen workers
    hosts: tuple[str, ...] = ()  # --hosts: only these workers
    # GPUs (planning/gpus.py): --gpus N, each node's first N (None: every GPU it declares), and the
    # indices --hosts named per host (node1:0,1).
    gpus: int | None = None
    gpu_ids: tuple[tuple[str, tuple[int, ...]], ...] = ()
    exclude: tuple[str, ...] = ()  # --exclude: not these workers
    port: int = contract.DEFAULT_MASTER_PORT
    allow_gpu_mismatch: bool = False


@dataclass(frozen=True)
class LaunchRequest:
    """How the ranks are started: the launcher, its options and arguments, the image."""

    launcher: str = "mpirun"
    # --launcher-opt KEY=VALUE (and --slurm-mode): the launcher's options given on the command line;
    # the others come from the inventory or their defaults (launchers/options.py).
    options: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()  # --launcher-args, split into words
    image: str | None = None  # --image; None: the inventory's distrun_image, if any
    container_runtime: str | None = None  # --container-runtime; None: distrun_container_runtime, else podman


@dataclass(frozen=True)
class RunPolicy:
    """What the run does around its attempts."""

    preflight: bool = True
    detach: bool = False  # return once every rank started (train --detach)
    max_restarts: int = 0  # restart the whole job this many times when a rank fails or a node is lost
    exclude_failed: bool = False  # restart without the node that failed, when the job still fits
    allow_concurrent: bool = False  # launch on hosts another run is using
    wait_s: int | None = None  # wait up to this many seconds for hosts or GPUs another run holds (train --wait)


@dataclass(frozen=True)
class JobRequest:
    """One 'distrun train' (or 'partition'), as asked."""

    inventory: Path
    program: ProgramRequest = ProgramRequest()
    placement: PlacementRequest = PlacementRequest()
    launch: LaunchRequest = LaunchRequest()
    policy: RunPolicy = RunPolicy()

    def partition_only(self) -> JobRequest:
        """The request of 'distrun partition': the reference workload's partition, nothing else."""
        return replace(self, program=replace(self.program, workload="gcn", script=None))


def load(request: JobRequest) -> Cluster:
    """The cluster this request runs on: the inventory's, with the workers --hosts/--exclude chose,
    less the drained ones (``load_noting`` says which)."""
    return load_noting(request)[0]


def load_noting(request: JobRequest) -> tuple[Cluster, list[str]]:
    """``load``'s cluster and one line for each drained worker it left out (store/drained.py: a
    node a check found unfit stays out of every run until a check passes on it)."""
    from distrun.store import drained

    chosen = select(load_cluster(request.inventory, paths.fact_cache_dir(request.inventory)), request.placement.hosts,
                    request.placement.exclude)
    _, marks = drained.left_out(request.inventory, [n.name for n in chosen.workers])
    return without_drained(chosen, {mark.node: mark.line() for mark in marks}, request.placement.hosts)


def environment(request: JobRequest, cluster: Cluster) -> dict[str, str]:
    """Every variable of the run's env.sh: the inventory's distrun_env, the workdir's file, --env."""
    return run_env(cluster, request.program.workdir, dict(request.program.env))


def without(cluster: Cluster, hosts: set[str] | frozenset[str]) -> Cluster:
    """The cluster with these workers left out (a restart without a failed node)."""
    return replace(cluster, workers=tuple(n for n in cluster.workers if n.name not in hosts))
