"""What the PyTorch trainers share: the launcher's variables, the process group, threads.

torch's env:// rendezvous reads RANK/WORLD_SIZE/LOCAL_RANK and MASTER_ADDR/MASTER_PORT.
torchrun sets them; under mpirun they are mapped from Open MPI's OMPI_COMM_WORLD_*; under Slurm
(or distrun's rank wrapper) they are already exported. Without any launcher variables a program
runs as one process without a process group.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import common
from common import CollectiveError, check_world


def map_mpi_env(env: dict[str, str]) -> None:
    """torch's env:// rendezvous reads RANK/WORLD_SIZE/LOCAL_RANK; mpirun sets OMPI_* instead."""
    pairs = {
        "RANK": "OMPI_COMM_WORLD_RANK",
        "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
        "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
        "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
    }
    for torch_var, ompi_var in pairs.items():
        if torch_var not in env and ompi_var in env:
            env[torch_var] = env[ompi_var]


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                    help="auto: nccl when torch sees a GPU, else gloo")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per rank (default: $OMP_NUM_THREADS, else the host's cores / local ranks)")


@dataclass
class Dist:
    torch: Any
    dist: Any
    rank: int
    world: int
    device: Any
    distributed: bool

    def allgather(self, obj: object) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.distributed:
            # Without this barrier some ranks tore the group down while others were still in
            # their last collective, and the job aborted at exit (2 of 7 runs, testbed.md).
            self.dist.barrier()
            self.dist.destroy_process_group()


def start(args: argparse.Namespace) -> Dist:
    """Map the launcher's variables, pick backend, device and threads, and join the group."""
    map_mpi_env(os.environ)  # type: ignore[arg-type]
    import torch
    import torch.distributed as dist

    distributed = "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    check_world(args, world)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise CollectiveError("--backend nccl needs a GPU that torch can see; use --backend gloo on CPU")
    if distributed:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(var):
                raise CollectiveError(f"{var} is not set; export it (mpirun -x {var}=...) or launch with torchrun")
    if args.threads is not None and args.threads < 1:
        raise CollectiveError("--threads must be at least 1")
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    if device.type == "cpu":
        threads = args.threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
        if not threads:
            # Ranks sharing a host would otherwise each start one thread per core.
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            threads = max(1, (os.cpu_count() or 1) // max(1, local_world))
        torch.set_num_threads(threads)
    else:
        torch.cuda.set_device(device)
    if distributed:
        # Naming the device binds the group to this rank's GPU (NCCL's barrier otherwise guesses it).
        bound = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world, **bound)
    return Dist(torch, dist, rank, world, device, distributed)


def run_main(prog: str, main: Callable[[], int]) -> None:
    """common.run_main, then leave without running C++ destructors. The result is printed and
    saved and the process group is destroyed, yet torch's gloo threads can still race the
    interpreter's teardown ("terminate called without an active exception", SIGABRT: seen in CI
    under mpirun). These programs never initialise MPI themselves, so skipping MPI_Finalize loses
    nothing."""
    try:
        common.run_main(prog, main)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
