"""sbatch scripts for a plan: pure functions, no host contacted.

Two modes (``plan.launch.options["mode"]``):

* ``single`` (default): one multi-node job; ``srun --mpi=pmix`` starts every rank, so MPI
  programs (mpi4py under Open MPI's PMIx) and torch programs (env:// from the rank wrapper's
  RANK/WORLD_SIZE, mapped from SLURM_PROCID/SLURM_NTASKS) run the same way as under mpirun.
* ``multi-job``: for sites that allow only single-node jobs. One job per node, each running one
  torchrun agent; the first (the master) is submitted first, and its node becomes MASTER_ADDR
  of the others, which are submitted once it runs (the driver does that: driver.py).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from distrun.errors import PlanError
from distrun.inventory.rules import slurm_node_name
from distrun.launchers.torchrun import torchrun_argv
from distrun.planning import containers
from distrun.transport import rundir

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan, RankHost

MODES = ("single", "multi-job")
# In the attempt's folder: srun's --output=ranks/<rank>/stdout, the batch step's output (%j: the
# job id) and the driver's submitted jobs.
RANKS = "ranks"
OUTPUT = "slurm-%j.out"
JOBIDS = "slurm-jobids"
ATTEMPT_FILES = (RANKS, "slurm-*.out", JOBIDS)
# At the top of the run directory: srun's placement where slots are uneven (SLURM_HOSTFILE).
HOSTFILE = "slurm-hostfile"
DEFAULT_MPI = "pmix"


def mode(plan: JobPlan) -> str:
    return plan.launch.options.get("mode") or "single"


def job_name(plan: JobPlan, index: int | None = None) -> str:
    """distrun-<run id>, and distrun-<run id>-<n> per node in multi-job mode: 'stop' finds both."""
    return f"distrun-{plan.run_id}" if index is None else f"distrun-{plan.run_id}-{index}"


def _uneven(plan: JobPlan) -> bool:
    return len({h.slots for h in plan.placement.hosts}) != 1


def placed_by_hostfile(plan: JobPlan) -> bool:
    """Single mode with uneven slots on named hosts: srun places ranks from slurm-hostfile."""
    return mode(plan) == "single" and _uneven(plan) and not _site(plan)


def slurm_hostfile(plan: JobPlan) -> str:
    """One line per rank, for ``--distribution=arbitrary``: uneven slots land where the plan says."""
    return "".join(f"{slurm_node_name(h.name)}\n" for h in plan.placement.hosts for _ in range(h.slots))


# What an #SBATCH value may hold: sbatch reads the line itself, and a newline would end the
# header and start a shell line. The inventory is checked at load; this guards the script too.
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9._:,/@%+=-]+")


def sbatch_line(option: str, value: object) -> str:
    text = str(value)
    if not _SBATCH_VALUE.fullmatch(text) or text.startswith("-"):
        raise PlanError(f"#SBATCH --{option}={text!r}: use letters, digits and ._:,/@%+=- only (check the inventory)")
    return f"#SBATCH --{option}={text}"


def _header(plan: JobPlan, name: str) -> list[str]:
    lines = [
        "#!/bin/bash",
        sbatch_line("job-name", name),
        # %j: the job id. The batch step's output: srun's own messages, never a rank's.
        sbatch_line("output", f"{rundir.attempt_path(plan)}/{OUTPUT}"),
        sbatch_line("chdir", plan.run_dir),
    ]
    if plan.launch.options.get("partition"):
        lines.append(sbatch_line("partition", plan.launch.options["partition"]))
    if plan.launch.options.get("time"):
        lines.append(sbatch_line("time", plan.launch.options["time"]))
    return lines


def _exports(plan: JobPlan) -> list[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in plan.program.env]


def _site(plan: JobPlan) -> bool:
    """A Slurm distrun does not administer (slurm_site): Slurm places the ranks, on the nodes
    the inventory names (nodelist) or on any it picks."""
    return plan.placement.login is not None


def _site_allocation(plan: JobPlan, nodes: int) -> list[str]:
    lines = [f"#SBATCH --nodes={nodes}"]
    if plan.launch.options.get("nodelist"):
        lines.append(sbatch_line("nodelist", ",".join(h.name for h in plan.placement.hosts)))
    lines += [f"#SBATCH --ntasks={plan.placement.world_size}", f"#SBATCH --ntasks-per-node={max(h.slots for h in plan.placement.hosts)}"]
    if plan.launch.options.get("cpus_per_task"):
        lines.append(sbatch_line("cpus-per-task", plan.launch.options["cpus_per_task"]))
    return lines


def _site_node_check(plan: JobPlan) -> str:
    """A first step on every node of the allocation: the run directory and the env must be there
    (distrun reached only the login node), else the node is named and the job ends."""
    check = (
        'h=${SLURMD_NODENAME:-$(hostname -s)}; '
        '[ -r "$1" ] || { echo "DISTRUN_FAILED_HOST $h $2 is not on $h: put distrun_shared_dir on a filesystem '
        'the compute nodes mount"; exit 1; }; '
        '[ -x "$3" ] || { echo "DISTRUN_FAILED_HOST $h $3 is not on $h: put distrun_env_prefix on a filesystem '
        'the compute nodes mount, or create the env there"; exit 1; }'
    )
    # In a container the program's interpreter is the image's: nothing to find on the node.
    interpreter = "/bin/sh" if plan.launch.container else plan.program.argv[0]
    return shlex.join(["srun", "--ntasks-per-node=1", f"--ntasks={len(plan.placement.hosts)}", "bash", "-c", check,
                       "distrun-node-check", plan.wrapper, plan.run_dir, interpreter])


def _gpus_per_node(plan: JobPlan) -> str:
    """The one job's GPUs per node (Slurm picks which: planning/gpus.py), as sbatch and srun take it;
    "" where the run uses none. Nodes selected with different counts are one line with the fix."""
    counts = {h.name: len(h.gpu_ids) for h in plan.placement.hosts}
    if len(set(counts.values())) > 1:
        few = min(counts, key=lambda n: counts[n])
        raise PlanError(f"--launcher slurm asks every node of the job for one GPU count (--gpus-per-node), but "
                        f"{', '.join(f'{n} has {c}' for n, c in counts.items())}; give --gpus {counts[few]} "
                        f"(or leave out {few})")
    count = max(counts.values(), default=0)
    return f"--gpus-per-node={count}" if count else ""


def sbatch_script(plan: JobPlan) -> str:
    """The one multi-node job of single mode."""
    nodes = len(plan.placement.hosts)
    lines = _header(plan, job_name(plan))
    if _site(plan):
        lines += _site_allocation(plan, nodes)
    else:
        lines += [f"#SBATCH --nodes={nodes}", sbatch_line("nodelist", ",".join(slurm_node_name(h.name) for h in plan.placement.hosts))]
        if _uneven(plan):
            # --ntasks-per-node is one number; uneven slots need the task count and an explicit
            # placement (SLURM_HOSTFILE, exported by the driver at submission and read by srun).
            lines += [f"#SBATCH --ntasks={plan.placement.world_size}", "#SBATCH --distribution=arbitrary"]
        else:
            lines.append(f"#SBATCH --ntasks-per-node={plan.placement.hosts[0].slots}")
    gpus_per_node = _gpus_per_node(plan)
    if gpus_per_node:
        lines.append(f"#SBATCH {gpus_per_node}")
    lines.append("set -euo pipefail")
    lines += _exports(plan)
    lines.append('export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"')
    lines.append(f"export MASTER_PORT={plan.placement.master_port}")
    if _site(plan):
        lines.append(_site_node_check(plan))
    rank_dirs = " ".join(rundir.in_attempt(plan, f"{RANKS}/{r}") for r in range(plan.placement.world_size))
    # srun opens each rank's output file on that rank's node: the folders must exist there
    # (in sync mode every node has its own copy of the run directory). One task per node, in
    # block distribution and without the job's SLURM_HOSTFILE (the submission's, where slots are
    # uneven): srun would place these tasks on its first lines and leave the last nodes out.
    unset = "env -u SLURM_HOSTFILE " if placed_by_hostfile(plan) else ""
    lines.append(f"{unset}srun --ntasks-per-node=1 --ntasks={nodes} --distribution=block mkdir -p {rank_dirs}")
    srun = ["srun", f"--mpi={plan.launch.options.get('mpi') or DEFAULT_MPI}", "--kill-on-bad-exit=1",
            f"--output={rundir.attempt_path(plan)}/{RANKS}/%t/stdout"]
    if placed_by_hostfile(plan):
        lines.append(f"export SLURM_HOSTFILE={shlex.quote(plan.run_dir + '/' + HOSTFILE)}")
        srun.append("--distribution=arbitrary")
    if gpus_per_node:
        srun.append(gpus_per_node)  # the step's too: each node's ranks share that many of its GPUs
    if plan.launch.container:
        srun += containers.pyxis_args(plan)  # each task in the image, through pyxis
    # --launcher-args go to srun, after distrun's own options.
    lines.append(shlex.join([*srun, *plan.launch.launcher_args, plan.wrapper, *plan.program.argv]))
    return "\n".join(lines) + "\n"


def _without_mpi4py_runner(program: tuple[str, ...]) -> tuple[str, ...]:
    # Separate jobs form no MPI world: torchrun's ranks must not start MPI (mpi4py's runner would).
    if program[1:3] == ("-m", "mpi4py"):
        return (program[0], *program[3:])
    return program


def multi_job_script(plan: JobPlan, index: int, host: RankHost) -> str:
    """Job ``index`` of multi-job mode: one node, one torchrun agent with that node's slots."""
    lines = _header(plan, job_name(plan, index))
    lines.append("#SBATCH --nodes=1")
    if not _site(plan) or plan.launch.options.get("nodelist"):
        lines.append(sbatch_line("nodelist", slurm_node_name(host.name)))
    lines += ["#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={host.slots}"]
    if host.gpu_ids:
        lines.append(f"#SBATCH --gpus-per-node={len(host.gpu_ids)}")
    lines.append("set -euo pipefail")
    lines += _exports(plan)
    if index == 0:
        # The name Slurm knows this node by, which every node resolves (the machine's own
        # hostname may not be in the others' /etc/hosts).
        lines.append('export MASTER_ADDR="$SLURMD_NODENAME"')
        lines.append('echo "DISTRUN_SLURM_MASTER $MASTER_ADDR"')
    else:
        lines.append(': "${MASTER_ADDR:?submit worker jobs with --export=ALL,MASTER_ADDR=<the master job node>}"')
    lines.append(f"export MASTER_PORT={plan.placement.master_port}")
    # The endpoint is known only when the job runs: the one word left to the shell.
    mark = "DISTRUN_MASTER_ADDR"
    # A --workdir command is the user's exact command; distrun's own Python gets no MPI world here.
    program = plan.program.argv if plan.program.workdir else _without_mpi4py_runner(plan.program.argv)
    torchrun = shlex.join(torchrun_argv(plan, host, endpoint_host=mark, store_host=index == 0, program=program, launcher_args=()))
    torchrun = torchrun.replace(f"--rdzv-endpoint={mark}:", '--rdzv-endpoint="$MASTER_ADDR":', 1)
    if plan.launch.container:
        # The agent and its workers in one container on the job's node.
        lines.append(f"export DISTRUN_HOST={shlex.quote(host.name)}")
        torchrun = f"{shlex.quote(containers.script_path(plan))} {torchrun}"
    # --launcher-args go to srun here too: Slurm starts the ranks' agent.
    lines.append(shlex.join(["srun", "--ntasks=1", "--kill-on-bad-exit=1", *plan.launch.launcher_args]) + f" {torchrun}")
    return "\n".join(lines) + "\n"


# The job scripts in the run directory: one multi-node job, or one job per node (multi-job mode).
JOB_FILE = "job.sbatch"
MULTI_JOB_PATTERN = "job-*.sbatch"


def multi_job_file(index: int) -> str:
    return MULTI_JOB_PATTERN.replace("*", str(int(index)))


# srun's tasks' own variables (Slurm's; PMIx's, and PMI-2's where the site's srun speaks it): with
# --image the tasks pass them into their container by these prefixes.
ENV_PREFIXES = ("SLURM_", "PMIX_", "PMI_")


def sbatch_files(plan: JobPlan) -> dict[str, str]:
    """Run-directory file name -> content: the sbatch script(s) of the plan's mode."""
    if mode(plan) == "multi-job":
        return {**{multi_job_file(i): multi_job_script(plan, i, h) for i, h in enumerate(plan.placement.hosts)},
                **containers.files(plan, per_rank=False, prefixes=ENV_PREFIXES)}
    files = {JOB_FILE: sbatch_script(plan)}
    if placed_by_hostfile(plan):
        files[HOSTFILE] = slurm_hostfile(plan)
    return files
