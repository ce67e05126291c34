"""From what the user asked and the inventory to a plan: the request, the network from cached
facts, and the dry run (the plan and every file and command it would run, touching no node)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path

from distrun import paths
from distrun.inventory import rules
from distrun.inventory.cluster import Cluster, load_cluster, load_facts
from distrun.launchers import launcher_named
from distrun.launchers.options import Resolved, resolve
from distrun.planning import containers
from distrun.planning.jobenv import run_env
from distrun.planning.jobplan import JobPlan
from distrun.planning.network import NetworkChoice, choose_interfaces, ifaces_from_facts
from distrun.planning.plan import build_plan
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.planning.selection import select, without_drained
from distrun.project.ready import Project, commands, load_project
from distrun.project.workdir import node_path


@dataclass
class JobRequest:
    inventory: Path
    launcher: str = "mpirun"
    np: int | None = None
    workload: str = "gcn"
    script: Path | None = None
    script_args: tuple[str, ...] = ()
    dataset: str = "synthetic"
    data_dir: str | None = None
    epochs: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    port: int = 29500
    preflight: bool = True
    # --launcher-opt KEY=VALUE (and --slurm-mode): the launcher's options given on the command line;
    # the others come from the inventory or their defaults (launchers/options.py).
    launcher_options: dict[str, str] = field(default_factory=dict)
    allow_gpu_mismatch: bool = False
    gdc: tuple[float, int] | None = None  # --use-gdc: (alpha, top-k) for the reference workloads
    detach: bool = False  # return once every rank started (train --detach)
    max_restarts: int = 0  # restart the whole job this many times when a rank fails or a node is lost
    exclude_failed: bool = False  # restart without the node that failed, when the job still fits
    allow_concurrent: bool = False  # launch on hosts another run is using
    workdir: Path | None = None  # --workdir: script_args are then the command every rank runs
    prepare: tuple[str, ...] = ()  # --prepare, split into words
    launcher_args: tuple[str, ...] = ()  # --launcher-args, split into words
    hosts: tuple[str, ...] = ()  # --hosts: only these workers
    exclude: tuple[str, ...] = ()  # --exclude: not these workers
    image: str | None = None  # --image; None: the inventory's distrun_image, if any
    container_runtime: str | None = None  # --container-runtime; None: distrun_container_runtime, else podman


def load(request: JobRequest) -> Cluster:
    """The cluster this request runs on: the inventory's, with the workers --hosts/--exclude chose,
    less the drained ones (``load_noting`` says which)."""
    return load_noting(request)[0]


def load_noting(request: JobRequest) -> tuple[Cluster, list[str]]:
    """``load``'s cluster and one line for each drained worker it left out (store/drained.py: a
    node a check found unfit stays out of every run until a check passes on it)."""
    from distrun.store import drained

    chosen = select(load_cluster(request.inventory, paths.fact_cache_dir(request.inventory)), request.hosts,
                    request.exclude)
    _, marks = drained.left_out(request.inventory, [n.name for n in chosen.workers])
    return without_drained(chosen, {mark.node: mark.line() for mark in marks}, request.hosts)


def environment(request: JobRequest, cluster: Cluster) -> dict[str, str]:
    """Every variable of the run's env.sh: the inventory's distrun_env, the workdir's file, --env."""
    return run_env(cluster, request.workdir, request.env)


def network(cluster: Cluster) -> NetworkChoice | None:
    """The interface per node from cached facts, or None when no facts were gathered yet."""
    cache = paths.fact_cache_dir(cluster.source)
    facts = {n.name: load_facts(cache, n.name) for n in cluster.workers}
    if any(f is None for f in facts.values()):
        return None
    addresses = {n.name: n.address for n in cluster.workers}
    ifaces = {h: ifaces_from_facts(f or {}) for h, f in facts.items()}
    default_ipv4 = {h: rules.default_ipv4(f) for h, f in facts.items()}
    overrides = {n.name: n.iface for n in cluster.workers if n.iface}
    if all(n.connection == "local" for n in cluster.workers):
        return None  # one machine: loopback is the network, nothing to choose
    return choose_interfaces(addresses, ifaces, overrides, default_ipv4, str(cluster.group_vars.get("distrun_network") or ""))


def facts_unusable(cluster: Cluster) -> str | None:
    """Why the cached facts cannot be planned from (missing, or about another machine), or None."""
    cache = paths.fact_cache_dir(cluster.source)
    for n in cluster.nodes:
        facts = load_facts(cache, n.name)
        if facts is None:
            return f"no facts cached for {n.name}"
        if not rules.is_ip(n.address):
            continue  # a name: the preflight play checks what it resolves to
        if n.connection == "local" or n.iface:
            continue
        ip = ipaddress.ip_address(n.address)
        if not any(ip in ipaddress.ip_network(i.network) for i in ifaces_from_facts(facts)):
            return f"the facts cached for {n.name} hold no interface on the subnet of its address {n.address}"
    return None


def without(cluster: Cluster, hosts: set[str]) -> Cluster:
    """The cluster with these workers left out (a restart without a failed node)."""
    return replace(cluster, workers=tuple(n for n in cluster.workers if n.name not in hosts))


def make_plan(request: JobRequest, cluster: Cluster, run_id: str, network: NetworkChoice | None,
              restart: int = 0) -> JobPlan:
    """The plan for a request; ``network`` is ``network(cluster)``, which run.yml also checks."""
    return build_plan(
        cluster,
        run_id=run_id,
        launcher=request.launcher,
        np=request.np,
        workload=None if request.script else request.workload,
        script=str(request.script) if request.script else None,
        script_args=request.script_args,
        dataset=request.dataset,
        data_dir=request.data_dir,
        epochs=request.epochs,
        extra_env=environment(request, cluster),
        network=network,
        master_port=request.port,
        slurm=launcher_named(request.launcher).settings(cluster, request.launcher_options),
        allow_gpu_mismatch=request.allow_gpu_mismatch,
        gdc=request.gdc,
        restart=restart,
        max_restarts=request.max_restarts,
        command=request.script_args if request.workdir else (),
        workdir=node_path(cluster.shared_dir, request.workdir) if request.workdir else None,
        prepare=request.prepare,
        launcher_args=request.launcher_args,
        container=containers.pinned(containers.choose(cluster.source, cluster.group_vars, request.image,
                                                      request.container_runtime), cluster.source),
    )


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


def dry_run(request: JobRequest) -> DryRun:
    cluster, left_out = load_noting(request)
    plan = make_plan(request, cluster, "DRYRUN", network(cluster))
    project = load_project(request.workdir, cluster.shared_dir) if request.workdir else None
    launcher = launcher_named(plan.launch.launcher)
    return DryRun(cluster, plan, plan_files(plan), launch_scripts(plan), launcher.unready(cluster),
                  project, commands(cluster, plan, project) if project else {},
                  resolve(launcher, request.launcher_options, cluster.group_vars, cluster.source), left_out)
