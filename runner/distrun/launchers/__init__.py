"""Launchers: pure functions from a JobPlan to the exact commands that start it."""

from __future__ import annotations

from .mpirun import mpirun_argv
from .torchrun import torchrun_argv
from .slurm import sbatch_script

__all__ = ["mpirun_argv", "torchrun_argv", "sbatch_script"]
