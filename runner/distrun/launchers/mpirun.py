"""Open MPI's mpirun (4.x): one launcher on the head starts every rank over ssh."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distrun.launchers.base import MPI_ABORT, MPI_PROCESS, Launcher
from distrun.planning import containers, envnames
from distrun.transport import nodeprog, remote, rundir

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan, RankHost

# Variables forwarded to every rank from the launcher's environment. --prefix already sets
# LD_LIBRARY_PATH for remote daemons; forwarding an unset one only makes mpirun warn.
_FORWARD = ("PATH",)
RANKS = "ranks"  # in the attempt's folder: mpirun's --output-filename, one folder per rank
# In the attempt's folder of a supervised run (train --detach --max-restarts N): the supervisor
# (role job's files/supervise.py behind the restart rule), its config, its record of every try,
# and each later try's hostfile.
SUPERVISOR, SUPERVISOR_CONFIG, SUPERVISOR_RECORD = "supervise.py", "supervise.json", "supervisor.json"
SUPERVISOR_PARTS = ("restartrule", "tries", "supervise")
PROBE_CONNECT_S = 5  # the supervisor's ssh probe of a host: how long it tries to connect


def mpirun_argv(plan: JobPlan) -> list[str]:
    argv = [
        f"{plan.launch.mpi_prefix.rstrip('/')}/bin/mpirun",
        "-np", str(plan.placement.world_size),
        "--hostfile", plan.hostfile,
        # --prefix makes remote orted start from the same installation: without it a conda
        # prefix that non-interactive ssh does not put on PATH fails with "orted: command not found".
        "--prefix", plan.launch.mpi_prefix,
        # Ranks go where the hostfile says, in order; never more than the slots.
        "--map-by", "slot",
        "--output-filename", f"{rundir.attempt_path(plan)}/{RANKS}",
    ]
    if plan.launch.run_as_root:
        argv.append("--allow-run-as-root")
    if relay_hosts(plan):
        # Each daemon on another node starts through that node's relay, inside the node's unit
        # of the attempt (role job's files/relay.py, installed by setup): ORTE puts --prefix's orted
        # in place of the word "orted" and splits the agent at spaces (the installed path has none).
        argv += ["--mca", "orte_launch_agent", " ".join([*nodeprog.relay_argv(plan.run_id, plan.attempt.restart, "join"),
                                                          "orted"])]
        # ssh with the system's client configuration only: a ~/.ssh/config a job wrote would run
        # its ProxyCommand or LocalCommand in this later run (ORTE splits the agent at spaces);
        # it logs in with the attempt's certificate (the run's hosts, minutes, the relay only).
        argv += ["--mca", "plm_rsh_agent", " ".join(remote.run_ssh(rundir.mesh_key(plan)))]
    # Open MPI's own parameter file and components only, in the daemons (and the ranks) too: never
    # the training user's ~/.openmpi, which a job can write (the daemons read it before they run).
    for name, value in plan.launch.openmpi_params:
        argv += ["--mca", name, value]
    if plan.placement.cidr:
        # A subnet rather than interface names: names may differ between nodes.
        argv += ["--mca", "btl_tcp_if_include", plan.placement.cidr, "--mca", "oob_tcp_if_include", plan.placement.cidr]
    if plan.placement.has_gpus:
        argv += ["--mca", "opal_cuda_support", "1"]
    for key, value in plan.program.env:
        argv += ["-x", f"{key}={value}"]
    for key in _FORWARD:
        argv += ["-x", key]
    # --launcher-args last among the options: mpirun reads them after distrun's own. With an
    # image, the rank wrapper runs on the node and hands the program to the container's start
    # (one container per rank, the host's mpirun and orted outside: the hybrid model).
    inside = [containers.script_path(plan)] if plan.launch.container else []
    argv += [*plan.launch.launcher_args, plan.wrapper, *inside, *plan.program.argv]
    return argv


def supervisor_config(plan: JobPlan) -> dict[str, Any]:
    """What the head's supervisor is given (supervise.py's docstring): mpirun's command line, the
    hosts, the restart policy, and the ssh command line of the daemons' logins for its probe."""
    key = rundir.mesh_key(plan)
    probe = [*remote.run_ssh(key), "-o", f"ConnectTimeout={PROBE_CONNECT_S}"] if relay_hosts(plan) else []
    return {"argv": mpirun_argv(plan), "hosts": [[h.name, h.slots] for h in plan.placement.hosts],
            "head": plan.placement.head.name, "np": plan.placement.world_size if plan.attempt.np_asked else None,
            "max_restarts": plan.attempt.max_restarts, "restart": plan.attempt.restart,
            "exclude_failed": plan.attempt.exclude_failed, "probe": probe,
            "release": [*nodeprog.relay_argv(plan.run_id, plan.attempt.restart, "join"), "--done"] if probe else [],
            "cert": f"{key}-cert.pub" if probe else "", "env": [["DISTRUN_RESTART", str(plan.attempt.restart)]],
            "record": SUPERVISOR_RECORD, "backoff_s": 1}


def relay_hosts(plan: JobPlan) -> list[RankHost]:
    """Every host but the head: mpirun's daemons there start over ssh."""
    return [h for h in plan.placement.hosts if h.name != plan.placement.head.name]


class Mpirun(Launcher):
    name = "mpirun"
    attempt_files = (RANKS, "supervise*.json", SUPERVISOR, SUPERVISOR_RECORD, "hostfile-*")
    rank_log_files = (f"{RANKS}/*/stdout",)
    summary = "Open MPI's mpirun on the head starts every rank over ssh (one MPI world)"
    owned_args = ("-np", "--np", "-n", "-c", "--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-H",
                  "--prefix", "--map-by", "--output-filename", "--launch-agent")
    # Its daemons' start through each node's relay (another agent would start them outside the
    # units), over ssh with the system's configuration.
    owned_params = {flag: envnames.OPEN_MPI_PARAMS for flag in ("--mca", "-mca")}
    mpi_world = True
    container_per_rank = True
    image_uses_node_mpi = True
    logs_in = True
    rank_variables = {"RANK": ("OMPI_COMM_WORLD_RANK",), "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE",),
                      "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK",),
                      "LOCAL_WORLD_SIZE": ("OMPI_COMM_WORLD_LOCAL_SIZE",)}
    env_prefixes = ("OMPI_", "PMIX_")
    failed_rank_patterns = (MPI_ABORT, MPI_PROCESS)
    supervised = True

    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        return [plan.placement.head]

    def environment(self, plan: JobPlan, host: RankHost) -> list[tuple[str, str]]:
        # mpirun reads its parameter files as it starts, before its command line's --mca.
        return [*super().environment(plan, host), *((f"OMPI_MCA_{k}", v) for k, v in plan.launch.openmpi_params)]

    def relay_hosts(self, plan: JobPlan) -> list[RankHost]:
        return relay_hosts(plan)

    def rank_order(self, hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
        # The hostfile lists the plan's hosts in order and --map-by slot fills each in turn.
        return list(hosts)

    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        if plan.attempt.supervised:  # the launch script runs in the attempt's folder
            return ["python3", "-I", SUPERVISOR, SUPERVISOR_CONFIG]
        return mpirun_argv(plan)

    def files(self, plan: JobPlan) -> dict[str, str]:
        files = containers.files(plan, per_rank=self.container_per_rank, prefixes=self.env_prefixes)
        if plan.attempt.supervised:
            program = "".join(nodeprog.part_path(name).read_text() for name in SUPERVISOR_PARTS)
            files[rundir.in_attempt(plan, SUPERVISOR)] = program
            files[rundir.in_attempt(plan, SUPERVISOR_CONFIG)] = json.dumps(supervisor_config(plan), indent=1) + "\n"
        return files

    def needs(self, plan: JobPlan) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        mpi_bin = f"{plan.launch.mpi_prefix.rstrip('/')}/bin"
        # orted: Open MPI 4; prted: Open MPI 5.
        nodes = {"orted": [f"{mpi_bin}/orted", f"{mpi_bin}/prted"]}
        if relay_hosts(plan):
            nodes["distrun relay"] = [nodeprog.installed("relay")]
        if plan.launch.container:
            nodes[plan.launch.container.runtime] = [plan.launch.container.runtime]
        return nodes, {"mpirun": [f"{mpi_bin}/mpirun"]}

    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        # --output-filename DIR: DIR/1/rank.N/stdout (the 1 is the job's number).
        return f"ranks/*/rank.{int(rank)}/stdout"
