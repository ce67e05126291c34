"""torchrun command lines: one agent per node, c10d rendezvous on the head."""

from __future__ import annotations

from ..plan import JobPlan, RankHost


def torchrun_argv(plan: JobPlan, host: RankHost, *, endpoint_host: str | None = None,
                  program: tuple[str, ...] | None = None) -> list[str]:
    """The command run on ``host``; every node gets the same rendezvous, its own slot count.

    ``endpoint_host`` replaces the plan's master address (Slurm's multi-job mode learns it only
    when the job runs); ``program`` replaces the plan's program.
    """
    torchrun = f"{plan.env_prefix.rstrip('/')}/bin/torchrun"
    return [
        torchrun,
        f"--nnodes={len(plan.hosts)}",
        f"--nproc-per-node={host.slots}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint_host or plan.master_addr}:{plan.master_port}",
        f"--rdzv-id={plan.run_id}",
        # A failed rank fails the job; restarting would hide the error from the user.
        "--max-restarts=0",
        f"--log-dir={plan.run_dir}/torchrun/{host.name}",
        "--redirects=3",
        "--tee=3",
        # The rank wrapper is a shell script, so torchrun must not prepend the interpreter.
        "--no-python",
        plan.wrapper,
        *(plan.program if program is None else program),
    ]


def torchrun_env(plan: JobPlan, host: RankHost) -> dict[str, str]:
    env = dict(plan.env)
    if host.iface:
        env["GLOO_SOCKET_IFNAME"] = host.iface
        env["NCCL_SOCKET_IFNAME"] = host.iface
    return env
