"""Launchers: one object per way of starting a plan's ranks, each a pure function of the plan."""

from __future__ import annotations

from distrun.errors import PlanError
from distrun.launchers.base import Launcher
from distrun.launchers.mpirun import Mpirun, mpirun_argv
from distrun.launchers.slurm import Slurm, sbatch_script
from distrun.launchers.ssh import Ssh
from distrun.launchers.torchrun import Torchrun, torchrun_argv

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (Mpirun(), Torchrun(), Slurm(), Ssh())}

__all__ = ["LAUNCHERS", "Launcher", "launcher_named", "mpirun_argv", "sbatch_script", "torchrun_argv"]


def launcher_named(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise PlanError(f"--launcher {name!r}: choose one of {', '.join(LAUNCHERS)}") from None
