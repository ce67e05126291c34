"""Launchers: one object per way of starting a plan's ranks, each a pure function of the plan."""

from __future__ import annotations

from ..errors import PlanError
from .base import Launcher
from .mpirun import Mpirun, mpirun_argv
from .slurm import Slurm, sbatch_script
from .ssh import Ssh
from .torchrun import Torchrun, torchrun_argv

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (Mpirun(), Torchrun(), Slurm(), Ssh())}

__all__ = ["LAUNCHERS", "Launcher", "launcher_named", "mpirun_argv", "sbatch_script", "torchrun_argv"]


def launcher_named(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise PlanError(f"--launcher {name!r}: choose one of {', '.join(LAUNCHERS)}") from None
