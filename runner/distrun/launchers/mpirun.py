"""mpirun command line for a plan (Open MPI 4.x)."""

from __future__ import annotations

from ..plan import JobPlan

# Variables forwarded to every rank from the launcher's environment. --prefix already sets
# LD_LIBRARY_PATH for remote daemons; forwarding an unset one only makes mpirun warn.
_FORWARD = ("PATH",)


def mpirun_argv(plan: JobPlan) -> list[str]:
    argv = [
        f"{plan.mpi_prefix.rstrip('/')}/bin/mpirun",
        "-np", str(plan.world_size),
        "--hostfile", plan.hostfile,
        # --prefix makes remote orted start from the same installation: without it a conda
        # prefix that non-interactive ssh does not put on PATH fails with "orted: command not found".
        "--prefix", plan.mpi_prefix,
        # Ranks go where the hostfile says, in order; never more than the slots.
        "--map-by", "slot",
        "--output-filename", f"{plan.run_dir}/ranks",
    ]
    if plan.run_as_root:
        argv.append("--allow-run-as-root")
    if plan.cidr:
        # A subnet rather than interface names: names may differ between nodes.
        argv += ["--mca", "btl_tcp_if_include", plan.cidr, "--mca", "oob_tcp_if_include", plan.cidr]
    if plan.has_gpus:
        argv += ["--mca", "opal_cuda_support", "1"]
    for key, value in plan.env:
        argv += ["-x", f"{key}={value}"]
    for key in _FORWARD:
        argv += ["-x", key]
    argv += [plan.wrapper, *plan.program]
    return argv
