"""Slurm: the driver on the head submits sbatch script(s), follows them and maps the final state.

``sbatch.py`` renders the job scripts (one multi-node job, or one job per node), ``driver.py``
the head's driver and the table of final states; this module is the launcher itself and what
it reads from the inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.errors import UserError
from distrun.inventory import slurm_site
from distrun.launchers.base import MPI_ABORT, MPI_PROCESS, TORCHRUN_ROOT_CAUSE, Launcher
from distrun.launchers.options import LauncherOption
from distrun.launchers.slurm.driver import DRIVER, STATE_EXIT, driver_files, driver_script, exit_code, rank_failure_lines
from distrun.launchers.slurm.sbatch import (
    ATTEMPT_FILES,
    DEFAULT_MPI,
    ENV_PREFIXES,
    HOSTFILE,
    JOB_FILE,
    MODES,
    MULTI_JOB_PATTERN,
    RANKS,
    job_name,
    mode,
    multi_job_script,
    sbatch_files,
    sbatch_script,
    slurm_hostfile,
)

if TYPE_CHECKING:
    from distrun.inventory.cluster import Cluster, Node
    from distrun.planning.jobplan import JobPlan, RankHost

__all__ = [
    "STATE_EXIT", "Slurm", "driver_files", "driver_script", "exit_code", "job_name", "mode", "multi_job_script",
    "rank_failure_lines", "sbatch_files", "sbatch_script", "settings", "slurm_hostfile",
]


def settings(cluster: Cluster, mode_override: str | None = None) -> dict[str, str]:
    """What the sbatch scripts take from the inventory (head's hostvars) and the CLI."""
    return Slurm().settings(cluster, {"mode": mode_override} if mode_override else None)


def enabled(cluster: Cluster) -> bool:
    value = cluster.group_vars.get("slurm_enabled", False)
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class Slurm(Launcher):
    name = "slurm"
    summary = "sbatch on the head, srun starts the ranks (--launcher-opt mode=single or multi-job)"
    options = (
        LauncherOption("mode", "one multi-node job, or one single-node job per node",
                       choices=MODES, inventory_key="slurm_mode", default="single"),
        LauncherOption("mpi", "srun's --mpi plugin, which starts the ranks of a single job",
                       inventory_key="slurm_srun_mpi", default=DEFAULT_MPI, metavar="TYPE"),
        LauncherOption("partition", "the partition the jobs are submitted to", inventory_key="slurm_partition",
                       unset="Slurm's default partition", metavar="NAME"),
        LauncherOption("time", "the jobs' time limit (sbatch --time)", inventory_key="slurm_time_limit",
                       unset="the partition's limit", metavar="TIME"),
    )
    owned_args = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--nodelist", "-w", "--job-name", "-J",
                  "--output", "-o", "--mpi")
    mpi_world = True
    picks_gpus = True
    run_dir_files = (DRIVER, HOSTFILE)
    run_dir_patterns = (JOB_FILE, MULTI_JOB_PATTERN)
    attempt_files = ATTEMPT_FILES
    rank_log_files = (f"{RANKS}/*/stdout",)
    # A job's final state beyond completed or failed (driver.STATE_EXIT maps each state to these).
    exit_codes = {124: "the job reached its time limit or deadline", 130: "the job was cancelled",
                  137: "a task ran out of memory", 143: "the job was preempted", 255: "a node of the job failed"}
    # srun's task variables; PMI_* where the site's srun speaks PMI-2 (--launcher-opt mpi=pmi2).
    rank_variables = {"RANK": ("SLURM_PROCID", "PMI_RANK"), "WORLD_SIZE": ("SLURM_NTASKS", "PMI_SIZE"),
                      "LOCAL_RANK": ("SLURM_LOCALID",)}
    env_prefixes = ENV_PREFIXES
    # Single mode runs MPI ranks under srun; multi-job mode runs one torchrun agent per job.
    failed_rank_patterns = (MPI_ABORT, MPI_PROCESS, TORCHRUN_ROOT_CAUSE)

    site = slurm_site.SCHEDULER

    def login(self, cluster: Cluster) -> Node | None:
        # On the site's Slurm the login node submits; the compute nodes are Slurm's, never reached.
        return cluster.head if cluster.site == self.site else None

    def settings(self, cluster: Cluster, given: Mapping[str, str] | None = None) -> dict[str, str]:
        out = super().settings(cluster, given)
        if cluster.site == self.site:
            # The site's own Slurm (the plan's login node says so): Slurm picks the nodes unless
            # the inventory names them.
            names = [n.name for n in cluster.workers]
            if slurm_site.named(names):
                out["nodelist"] = ",".join(names)
            out.update(slurm_site.job_options(cluster.source, cluster.group_vars))
        return out

    def cancel(self, plan: JobPlan) -> dict[str, Any]:
        # Role slurm's cancel: the training user's jobs of the run's name, by scancel.
        return {"distrun_cancel_role": "slurm", "slurm_cancel_run_id": plan.run_id}

    def unready(self, cluster: Cluster) -> str | None:
        if enabled(cluster) or cluster.site == self.site:
            return None
        return f"slurm_enabled is not true in {cluster.source}: a real run is refused until it is (and 'distrun setup' ran)"

    def require_ready(self, cluster: Cluster) -> None:
        if not (enabled(cluster) or cluster.site == self.site):
            raise UserError(
                f"inventory {cluster.source}: --launcher slurm needs Slurm on the nodes; set slurm_enabled: true "
                "in its group_vars and run 'distrun setup' (see docs/guide/slurm.md)"
            )

    def files(self, plan: JobPlan) -> dict[str, str]:
        return {**sbatch_files(plan), **driver_files(plan)}

    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        return [plan.placement.head]

    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        # The driver submits, follows and maps the final state (driver.py).
        return ["bash", f"{plan.run_dir}/{DRIVER}"]

    def needs(self, plan: JobPlan) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if plan.launch.container and mode(plan) == "multi-job":
            return {plan.launch.container.runtime: [plan.launch.container.runtime]}, {"sbatch": ["sbatch"], "srun": ["srun"]}
        return {}, {"sbatch": ["sbatch"], "srun": ["srun"]}

    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        # srun --output=ranks/%t/stdout
        return f"ranks/{int(rank)}/stdout"

    def exit_code(self, rc: int) -> int:
        # The driver already mapped the job's final state to rc (STATE_EXIT): keep it.
        return rc

    def failure_lines(self, rank_logs: Mapping[int, Path]) -> list[str]:
        # srun names no rank after an MPI_Abort: it reports every task as killed.
        return rank_failure_lines(rank_logs)
