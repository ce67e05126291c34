"""sbatch script for a plan: one multi-node job, srun starting ranks (or torchrun per node)."""

from __future__ import annotations

import shlex

from ..plan import JobPlan


def sbatch_script(plan: JobPlan) -> str:
    nodes = len(plan.hosts)
    per_node = {h.slots for h in plan.hosts}
    if len(per_node) != 1:
        # Slurm's --ntasks-per-node is one number; uneven slots need an explicit task count.
        tasks_line = f"#SBATCH --ntasks={plan.world_size}"
    else:
        tasks_line = f"#SBATCH --ntasks-per-node={per_node.pop()}"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=distrun-{plan.run_id}",
        f"#SBATCH --nodes={nodes}",
        tasks_line,
        f"#SBATCH --nodelist={','.join(h.name for h in plan.hosts)}",
        f"#SBATCH --output={plan.run_dir}/slurm-%j-%t.out",
        f"#SBATCH --chdir={plan.run_dir}",
    ]
    if plan.slurm.get("partition"):
        lines.append(f"#SBATCH --partition={plan.slurm['partition']}")
    if plan.slurm.get("time"):
        lines.append(f"#SBATCH --time={plan.slurm['time']}")
    gpus = {h.gpus for h in plan.hosts}
    if max(gpus) > 0:
        lines.append(f"#SBATCH --gres=gpu:{min(gpus)}")
    lines.append("set -euo pipefail")
    for key, value in plan.env:
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append('export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"')
    lines.append(f"export MASTER_PORT={plan.master_port}")
    lines.append(f"srun --kill-on-bad-exit=1 --label {shlex.join([plan.wrapper, *plan.program])}")
    return "\n".join(lines) + "\n"
