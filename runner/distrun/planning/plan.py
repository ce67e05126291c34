"""The job plan built from the inventory and what the user asked (request.py): the reference
workloads, the program each rank runs, the ranks' variables, and the run's hostfile. Its records
are in jobplan.py; launchers are pure functions of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from distrun.errors import PlanError
from distrun.inventory import identity, rules
from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.planning import containers, gpus, limits
from distrun.planning.envnames import check_env_key
from distrun.planning.jobplan import AttemptInfo, JobPlan, Launch, Placement, Program, RankHost
from distrun.planning.network import NetworkChoice
from distrun.planning.placement import allocate, check_gpu_slots
from distrun.planning.request import JobRequest
from distrun.planning.variables import run_values, substitute, substitute_strict
from distrun.project.workdir import node_path
from distrun.transport import nodeprog, rundir


@dataclass(frozen=True)
class Workload:
    name: str
    program: str  # file under workloads/
    needs_partition: bool
    framework: str  # jittor, torch or any
    description: str


WORKLOADS: Mapping[str, Workload] = {
    "gcn": Workload("gcn", "gcn_jittor.py", True, "jittor", "2-layer GCN, Jittor + MPI halo exchange over Metis parts"),
    "gcn-tp": Workload("gcn-tp", "gcn_tp.py", False, "jittor", "2-layer GCN, weights sharded across ranks"),
    "ddp": Workload("ddp", "gcn_ddp.py", False, "torch", "2-layer GCN, PyTorch DistributedDataParallel"),
    "gcn-torch": Workload("gcn-torch", "gcn_torch.py", True, "torch", "2-layer GCN, PyTorch, all-to-all halo exchange over Metis parts"),
}


def gdc_args(gdc: tuple[float, int] | None) -> list[str]:
    """The workloads' GDC flags for (alpha, top-k), checked here so a bad value fails before any node is touched."""
    if gdc is None:
        return []
    alpha, topk = gdc
    if not 0.0 < alpha < 1.0:
        raise PlanError(f"--gdc-alpha {alpha}: the teleport probability must lie in (0, 1)")
    if topk < 1:
        raise PlanError(f"--gdc-topk {topk}: keep at least 1 entry per node")
    return ["--use-gdc", "--gdc-alpha", repr(float(alpha)), "--gdc-topk", str(int(topk))]


def build_plan(cluster: Cluster, request: JobRequest, *, run_id: str, env: Mapping[str, str] | None = None,
               network: NetworkChoice | None = None, restart: int = 0) -> JobPlan:
    """The plan of one attempt of ``request`` on ``cluster``: the request's values resolved against
    the inventory (the launcher's options, the image, the workdir's folder on the nodes) and
    placed. ``env``: the ranks' variables (``request.environment``: only their names enter the
    plan), ``network``: ``network.network(cluster)``, which run.yml checks before it stages."""
    asked, wanted = request.launch, request.program
    launcher = asked.launcher
    np, master_port = request.placement.np, request.placement.port
    workload = None if wanted.script else wanted.workload
    script = str(wanted.script) if wanted.script else None
    # With --workdir the words after -- are the command itself; else the program's arguments.
    command, script_args = (wanted.args, ()) if wanted.workdir else ((), wanted.args)
    dataset, data_dir, epochs, gdc, prepare = wanted.dataset, wanted.data_dir, wanted.epochs, wanted.gdc, wanted.prepare
    workdir = node_path(cluster.shared_dir, wanted.workdir) if wanted.workdir else None
    options = launcher_named(launcher).settings(cluster, asked.options)
    container = containers.pinned(containers.choose(cluster.source, cluster.group_vars, asked.image,
                                                    asked.container_runtime), cluster.source)
    if cluster.has_people and (refused := identity.refusal(launcher, container is not None)):
        raise PlanError(refused)
    extra_env = env or {}
    mpi_world = launcher_named(launcher).mpi_world
    asked_gpus = gpus.Asked(request.placement.gpus, dict(request.placement.gpu_ids))
    if not asked_gpus.chosen:  # a selection of the user's is checked against the slots per host instead
        check_gpu_slots(cluster, allow=request.placement.allow_gpu_mismatch)
    placed = allocate(cluster, np)
    world = sum(n for _, n in placed)
    by_name = {n.name: n for n in cluster.workers}
    run_dir = rundir.run_dir(cluster.shared_dir, run_id)
    # In a container the image's Python runs the program, found on the image's PATH.
    host_python = f"{cluster.env_prefix.rstrip('/')}/bin/python"
    python = "python3" if container else host_python

    def iface_of(name: str) -> str | None:
        if network is not None and name in network.per_host:
            return network.per_host[name].name
        return by_name[name].iface

    def net_address_of(name: str) -> str:
        if network is not None and name in network.per_host:
            return network.per_host[name].address
        return by_name[name].address

    picks = launcher_named(launcher).picks_gpus

    def gpus_of(name: str, n: int) -> gpus.HostGpus:
        return gpus.host_gpus(by_name[name], n, asked_gpus, cluster.source, scheduler_picks=picks,
                              lenient=request.placement.allow_gpu_mismatch)

    hosts = tuple(
        RankHost(name, by_name[name].address, n, by_name[name].gpus, iface_of(name), net_address_of(name),
                 **vars(gpus_of(name, n)))
        for name, n in placed
    )
    # Rank 0 hosts torch's store and torchrun's rendezvous: the first rank host (the head
    # whenever it runs ranks, as rank order puts it first).
    master_addr = hosts[0].net_address

    partition: tuple[str, ...] | None = None
    part_dir: str | None = None
    values = run_values(np=world, hosts=[h.name for h in hosts], head=cluster.head.name, run_id=run_id,
                        run_dir=run_dir, workdir=workdir, shared_dir=cluster.shared_dir)
    if (command or script) and gdc is not None:
        raise PlanError("--use-gdc applies to the reference workloads; pass your own program's options after --")
    if command:
        # The exact command the user gave, on every rank: not rewritten, only {np} & co. filled in.
        program = substitute(command, values)
        workload_name = None
    elif script:
        program = (python, f"{run_dir}/{PurePosixPath(script).name}", *script_args)
        workload_name = None
    else:
        wl = WORKLOADS.get(workload or "")
        if wl is None:
            raise PlanError(f"--workload {workload!r}: choose one of {', '.join(WORKLOADS)} or pass --script PATH")
        workloads_dir = f"{cluster.shared_dir.rstrip('/')}/workloads"
        data_args: list[str] = ["--dataset", dataset]
        if data_dir:
            data_args += ["--data-dir", data_dir]
        data_args += gdc_args(gdc)
        program_args = [*data_args]
        if wl.needs_partition:
            part_dir = f"{cluster.shared_dir.rstrip('/')}/partitions/{dataset}-{world}parts{'-gdc' if gdc else ''}"
            # The partitioner runs on the head itself (role job), in the node's env.
            partition = (host_python, f"{workloads_dir}/partition.py", *data_args, "--num-parts", str(world), "--out", part_dir)
            program_args += ["--part-dir", part_dir, "--num-parts", str(world)]
        if epochs is not None:
            program_args += ["--epochs", str(epochs)]
        program_args += ["--result-file", f"{run_dir}/{rundir.RESULT}"]
        program = (python, f"{workloads_dir}/{wl.program}", *program_args, *script_args)
        workload_name = wl.name

    if mpi_world and not command:
        # Under MPI, run Python through mpi4py's runner: a rank that raises or exits non-zero
        # then calls MPI_Abort and the whole job ends at once. Without it, mpi4py finalizes MPI
        # at exit and Open MPI waits for every other rank before it reports the failure.
        program = (program[0], "-m", "mpi4py", *program[1:])
    # PYTHONNOUSERSITE: no rank imports from ~/.local, where a job of the shared training
    # account could leave a module (or a .pth file) for every later run.
    env = {nodeprog.RUN_TAG: run_id, "DISTRUN_RUN_DIR": run_dir, "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1",
           "DISTRUN_RESTART": str(restart),
           "DISTRUN_CHECKPOINT_DIR": rundir.checkpoint_dir(cluster.shared_dir, run_id)}
    if workdir:
        env["DISTRUN_WORKDIR"] = workdir
    # Every rank's MPI_Init reads Open MPI's own files only, under every launcher; in an image, the
    # image's Open MPI keeps its own (its folders are not the node's, and the home is not mounted).
    if not container:
        env.update({f"OMPI_MCA_{name}": value for name, value in cluster.openmpi_params})
    for key in extra_env or {}:
        check_env_key(key)
    return JobPlan(
        run_id=run_id,
        shared_dir=cluster.shared_dir,
        placement=Placement(
            hosts=hosts, world_size=world, master_addr=master_addr, master_port=master_port,
            cidr=network.cidr if network else None,
            login=RankHost(login.name, login.address, 0, 0, None) if (login := launcher_named(launcher).login(cluster)) else None),
        program=Program(
            argv=program, env=tuple(sorted(env.items())), user_env_keys=tuple(sorted(extra_env or {})),
            workload=workload_name, partition=partition, partition_dir=part_dir, workdir=workdir,
            prepare=substitute_strict(prepare, values, "--prepare") if prepare else ()),
        launch=Launch(
            launcher=launcher, user=cluster.user, run_as_root=cluster.user == "root", mpi_prefix=cluster.mpi_prefix,
            env_prefix=cluster.env_prefix, launcher_args=tuple(asked.args), options=options,
            container=container, unit_limits=limits.from_inventory(cluster.source, cluster.group_vars),
            openmpi_params=cluster.openmpi_params, people=cluster.has_people),
        attempt=AttemptInfo(restart=restart, max_restarts=request.policy.max_restarts, min_nodes=min_nodes(request, len(hosts)),
                            **supervision(request)),
    )


def supervision(request: JobRequest) -> dict[str, bool]:
    """AttemptInfo's supervisor fields: a detached run with restarts whose launcher distrun's
    supervisor restarts on the head (Launcher.supervised); none otherwise."""
    policy = request.policy
    if not (policy.detach and policy.max_restarts and launcher_named(request.launch.launcher).supervised):
        return {}
    return {"supervised": True, "exclude_failed": policy.exclude_failed, "np_asked": request.placement.np is not None}


def min_nodes(request: JobRequest, hosts: int) -> int:
    """How few of the plan's ``hosts`` a detached run restarted by its launcher goes on with
    (AttemptInfo.min_nodes). With --exclude-failed: one, the rendezvous host, as the follower goes
    on while a node is left (run/restarts.py); 0, every host, otherwise. The launcher's agents
    each keep their node's rank count, so a world size of --np cannot follow the nodes left."""
    policy, launcher = request.policy, request.launch.launcher
    if not (policy.detach and policy.max_restarts and policy.exclude_failed and launcher_named(launcher).restarts_itself):
        return 0
    if request.placement.np is not None:
        raise PlanError(f"--np {request.placement.np} with --detach --exclude-failed: {launcher} goes on without a "
                        "node by running fewer ranks, never --np of them; drop --np (the ranks follow the nodes left) "
                        "or drop --exclude-failed")
    return 1 if hosts > 1 else 0


def render_hostfile(plan: JobPlan) -> str:
    """The run's hostfile: the hosts this run places ranks on, with the ranks each takes."""
    return rules.hostfile(((h.name, h.slots) for h in plan.placement.hosts), f"# Generated by distrun for run {plan.run_id}")
