"""torchrun: one agent per node, c10d rendezvous on the head."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distrun.launchers.base import TORCHRUN_ROOT_CAUSE, Launcher
from distrun.planning import containers
from distrun.transport import rundir

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan, RankHost


# In the attempt's folder: torchrun's --log-dir, one folder per host.
LOG_DIR = "torchrun"


def nnodes(plan: JobPlan) -> str:
    """torchrun's --nnodes: every host of the plan (one agent each), or MIN:MAX when a detached run
    goes on without a lost node (--exclude-failed: AttemptInfo.min_nodes). Then the agents left
    form the group again on the rendezvous of the first rank host (the head whenever it runs
    ranks; its agent holds the store, so that host is never left out), each with its node's
    slots: the world size is the slots of the nodes left, as after the follower's restart."""
    hosts, least = len(plan.placement.hosts), plan.attempt.min_nodes
    return f"{least}:{hosts}" if 0 < least < hosts else str(hosts)


def torchrun_argv(plan: JobPlan, host: RankHost, *, endpoint_host: str | None = None, store_host: bool | None = None,
                  program: tuple[str, ...] | None = None, launcher_args: tuple[str, ...] | None = None) -> list[str]:
    """The command run on ``host``; every node gets the same rendezvous, its own slot count.

    ``endpoint_host`` replaces the plan's master address (Slurm's multi-job mode learns it only
    when the job runs) and ``store_host`` says whether this agent hosts the rendezvous store
    (default: ``host`` is the plan's first rank host, whose address is the endpoint);
    ``program`` replaces the plan's program; ``launcher_args`` the plan's --launcher-args (they
    come after distrun's options, so a repeated option such as --max-restarts takes the user's value).
    """
    if store_host is None:
        store_host = host.name == plan.placement.hosts[0].name
    # In a container: the image's torchrun, on its PATH.
    torchrun = "torchrun" if plan.launch.container else f"{plan.launch.env_prefix.rstrip('/')}/bin/torchrun"
    return [
        torchrun,
        f"--nnodes={nnodes(plan)}",
        f"--nproc-per-node={host.slots}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint_host or plan.placement.master_addr}:{plan.placement.master_port}",
        f"--rdzv-id={plan.run_id}",
        # Which agent starts the c10d store. Left to itself, torch decides by matching the
        # endpoint against the addresses of the machine's hostname, and Debian's and Ubuntu's
        # installers put that hostname on 127.0.1.1: then no agent starts the store and every
        # agent waits for it until the rendezvous times out. distrun knows the head: say so.
        f"--rdzv-conf=is_host={1 if store_host else 0}",
        # How the other agents reach this one (the first one's address becomes the ranks'
        # MASTER_ADDR): the node's cluster address, not a hostname the others may not resolve.
        f"--local-addr={host.net_address or host.address}",
        # In-node restarts: torchrun's agents restart every worker at once up to this many
        # times (0 unless the run asked for restarts); distrun restarts the job when a node is lost
        # while it follows the run, and a detached run's agents are its only restarts.
        f"--max-restarts={int(plan.attempt.max_restarts)}",
        f"--log-dir={rundir.attempt_path(plan)}/{LOG_DIR}/{host.name}",
        "--redirects=3",
        "--tee=3",
        *(plan.launch.launcher_args if launcher_args is None else launcher_args),
        # The rank wrapper is a shell script, so torchrun must not prepend the interpreter.
        "--no-python",
        plan.wrapper,
        *(plan.program.argv if program is None else program),
    ]


def torchrun_env(plan: JobPlan, host: RankHost) -> dict[str, str]:
    env = dict(plan.program.env)
    if plan.launch.container:
        env["DISTRUN_HOST"] = host.name  # which node the container starts on: its GPUs
    if host.iface:
        env["GLOO_SOCKET_IFNAME"] = host.iface
        env["NCCL_SOCKET_IFNAME"] = host.iface
    return env


class Torchrun(Launcher):
    name = "torchrun"
    attempt_files = (LOG_DIR,)
    rank_log_files = (f"{LOG_DIR}/*/stdout.log",)
    summary = "one torchrun agent per rank host, c10d rendezvous on the first"
    owned_args = ("--nnodes", "--nproc-per-node", "--nproc_per_node", "--node-rank", "--node_rank", "--rdzv-backend",
                  "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--master-addr",
                  "--master_addr", "--master-port", "--master_port", "--standalone", "--no-python", "--no_python")
    failed_rank_patterns = (TORCHRUN_ROOT_CAUSE,)
    # Its elastic agents restart the workers (--max-restarts) and, with --nnodes MIN:MAX, go on
    # without a lost node, with no distrun process following the run.
    restarts_itself = True
    restarts_in_place = True

    def rank_order(self, hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
        # The c10d rendezvous numbers its agents in the sorted order of their --local-addr
        # strings (torch.distributed.elastic's dynamic rendezvous), and each agent's workers take
        # the global ranks after those of the agents before it.
        return sorted(hosts, key=lambda h: str(h.get("net_address") or h.get("address") or ""))

    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        return list(plan.placement.hosts)

    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        # With an image: the agent and its workers in one container on the node.
        inside = [containers.script_path(plan)] if plan.launch.container else []
        return [*inside, *torchrun_argv(plan, host)]

    def files(self, plan: JobPlan) -> dict[str, str]:
        return containers.files(plan, per_rank=False, prefixes=self.env_prefixes)

    def environment(self, plan: JobPlan, host: RankHost) -> list[tuple[str, str]]:
        # The plan's env holds DISTRUN_RUN_ID, which tags the agent for 'distrun stop'.
        return sorted(torchrun_env(plan, host).items())

    def image_modules(self, plan: JobPlan) -> tuple[str, ...]:
        return ("torch",)  # the image's own torchrun (torch's) starts the workers in it

    def needs(self, plan: JobPlan) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if plan.launch.container:
            return {plan.launch.container.runtime: [plan.launch.container.runtime]}, {}
        return {"torchrun": [f"{plan.launch.env_prefix.rstrip('/')}/bin/torchrun"]}, {}

    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        # --log-dir DIR/torchrun/HOST: <run id>_<random>/attempt_0/<local rank>/stdout.log
        return f"torchrun/{shlex.quote(host)}/*/attempt_*/{int(local_rank)}/stdout.log"
