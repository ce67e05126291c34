"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: the message names the file, host or flag, and the fix."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InventoryError(UserError):
    """The inventory cannot describe a cluster distrun can run on."""


class PlanError(UserError):
    """The requested job does not fit the cluster (world size, script, flags)."""


# Every exit code distrun returns, and what it means ('distrun --help' and docs/guide/cli.md
# list them). A launcher's own codes are mapped to these (Slurm's final states: 124-255).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "the job failed (a rank exited non-zero, a node was lost), a check failed, 'setup' or 'partition' failed, "
        "'stop' could not reach a node"),
    (2, "bad usage: an option, inventory, run id or value was refused before anything ran"),
    (3, "the preflight refused the run; nothing was started"),
    (4, "staging failed: the run's files did not reach every node; nothing was started"),
    (5, "the launch failed on a node"),
    (124, "Slurm: the job reached its time limit or deadline"),
    (130, "interrupted (Ctrl-C), or the Slurm job was cancelled"),
    (137, "Slurm: a task ran out of memory"),
    (143, "Slurm: the job was preempted"),
    (255, "Slurm: a node of the job failed"),
)
