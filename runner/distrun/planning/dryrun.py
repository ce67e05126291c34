"""The dry run: everything a run would do (the plan and every file and command it would run, the
launcher's options and where each value came from), touching no node."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.launchers.base import fill
from distrun.launchers.options import Resolved, resolve
from distrun.planning.attempt import plan_attempt
from distrun.planning.gpus import first_free_at_launch
from distrun.planning.jobplan import JobPlan
from distrun.planning.request import JobRequest, load_noting
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.project.ready import Project, commands, load_project


@dataclass(frozen=True)
class DryRun:
    """Everything a run would do, for --dry-run to show."""

    cluster: Cluster
    plan: JobPlan
    files: dict[str, str]  # run-directory file -> its text
    scripts: dict[str, str]  # host -> its launch script
    note: str | None  # why a real run would be refused, if it would
    project: Project | None = None  # --workdir: the folder and what a sync would send
    before: dict[str, str] = field(default_factory=dict)  # title -> command run before the launch
    options: dict[str, Resolved] = field(default_factory=dict)  # the launcher's options and their origins
    left_out: list[str] = field(default_factory=list)  # a line per drained worker the run leaves out
    gpus: list[GpuRow] = field(default_factory=list)  # each rank's GPUs, where the run maps any
    # --gpus N: the hosts whose first N GPUs the mapping shows, where train takes the first N free at launch
    first_free: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GpuRow:
    """One rank's GPUs as the plan maps them: ``gpus`` its own (nvidia-smi's indices on its host),
    ``visible`` its CUDA_VISIBLE_DEVICES (None: the scheduler's, or the node's left as it is)."""

    host: str
    rank: int | None  # None: the scheduler numbers the ranks
    local_rank: int
    gpus: tuple[int, ...]
    visible: str | None


def gpu_rows(plan: JobPlan) -> list[GpuRow]:
    """Every rank's GPUs, in rank order where the launcher knows it ([] where no host has GPUs)."""
    hosts = plan.placement.hosts
    if not any(h.gpu_ids or h.visible for h in hosts):
        return []
    order = launcher_named(plan.launch.launcher).rank_order([asdict(h) for h in hosts])
    ranks = fill(order) if order is not None else {}
    by_name = {h.name: h for h in hosts}
    rows = []
    for name in [str(h["name"]) for h in order] if order is not None else list(by_name):
        h = by_name[name]
        for local in range(h.slots):
            rank = ranks[name][local] if ranks else None
            own = h.rank_gpus[local] if h.rank_gpus else ()
            rows.append(GpuRow(name, rank, local, own, h.visible[local] if h.visible else None))
    return sorted(rows, key=lambda r: (r.rank is None, r.rank or 0))


def dry_run(request: JobRequest) -> DryRun:
    cluster, left_out = load_noting(request)
    plan = plan_attempt(request, cluster, "DRYRUN").plan
    workdir = request.program.workdir
    project = load_project(workdir, cluster.shared_dir) if workdir else None
    launcher = launcher_named(plan.launch.launcher)
    # Which GPUs are free is the nodes' claims' to say at launch: the dry run asks no node (it
    # works offline, and the answer could change before train), so it labels those hosts.
    mapped = {h.name for h in plan.placement.hosts if h.visible}
    first_free = [h for h in first_free_at_launch(cluster.nodes, request.placement.gpus,
                                                  (n for n, _ in request.placement.gpu_ids),
                                                  allow_concurrent=request.policy.allow_concurrent) if h in mapped]
    return DryRun(cluster, plan, plan_files(plan), launch_scripts(plan), launcher.unready(cluster),
                  project, commands(cluster, plan, project) if project else {},
                  resolve(launcher, request.launch.options, cluster.group_vars, cluster.source), left_out,
                  gpu_rows(plan), first_free)
