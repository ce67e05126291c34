"""Launchers: one object per way of starting a plan's ranks, each a pure function of the plan.

A launcher is its own module or package plus one line: its entry in ``LAUNCHERS`` here, or, for
one that lives outside distrun (a package of its own, a test's), its ``module:Class`` in the
variable ``DISTRUN_LAUNCHERS`` (comma-separated), imported when this registry is. Nothing else
names it: the CLI's choices, the help, the exit codes' table, the files collected and the stop
play all read its declarations (base.py).
"""

from __future__ import annotations

import importlib
import os

from distrun.errors import EXIT_CODES, PlanError
from distrun.launchers.base import Launcher
from distrun.launchers.mpirun import Mpirun, mpirun_argv
from distrun.launchers.slurm import Slurm, sbatch_script
from distrun.launchers.ssh import Ssh
from distrun.launchers.torchrun import Torchrun, torchrun_argv

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (Mpirun(), Torchrun(), Slurm(), Ssh())}
# Entries of DISTRUN_LAUNCHERS that could not be registered: entry -> why (said when one is asked for).
UNREGISTERED: dict[str, str] = {}


def _register_outside(spec: str) -> None:
    """Each ``module:Class`` of spec, instantiated and registered by its ``name``."""
    for entry in (e.strip() for e in spec.split(",") if e.strip()):
        module, _, attr = entry.partition(":")
        try:
            launcher = getattr(importlib.import_module(module), attr)()
            if not isinstance(launcher, Launcher) or not launcher.name or launcher.name in LAUNCHERS:
                raise TypeError("not a Launcher with a name of its own")
        except Exception as exc:  # noqa: BLE001 - any failure is told when the launcher is asked for
            UNREGISTERED[entry] = f"{type(exc).__name__}: {exc}"
            continue
        LAUNCHERS[launcher.name] = launcher


_register_outside(os.environ.get("DISTRUN_LAUNCHERS", ""))

__all__ = ["LAUNCHERS", "Launcher", "exit_codes", "launcher_named", "mpirun_argv", "sbatch_script", "torchrun_argv"]


def launcher_named(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        unregistered = "".join(f"; DISTRUN_LAUNCHERS {entry!r} was not registered: {why}" for entry, why in UNREGISTERED.items())
        raise PlanError(f"--launcher {name!r}: choose one of {', '.join(LAUNCHERS)}{unregistered}") from None


def exit_codes() -> tuple[tuple[int, str], ...]:
    """Every exit code distrun may give, in order, with its meaning: distrun's own (errors.ExitCode)
    and each launcher's (``Launcher.exit_codes``, after its name); for 'distrun --help' and the CLI
    guide's table."""
    meanings: dict[int, list[str]] = {code: [meaning] for code, meaning in EXIT_CODES}
    for launcher in LAUNCHERS.values():
        for code, meaning in launcher.exit_codes.items():
            meanings.setdefault(code, []).append(f"{launcher.name}: {meaning}")
    return tuple((code, "; ".join(said)) for code, said in sorted(meanings.items()))
