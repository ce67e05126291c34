"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """distrun's own exit codes. A launcher maps its end to one of these or to a code it declares
    itself (``Launcher.exit_codes``); 'distrun --help' and docs/guide/cli.md list both
    (``launchers.exit_codes``), and a unit test greps the code for any other."""

    OK = 0
    FAILED = 1
    USAGE = 2
    PREFLIGHT = 3
    STAGING = 4
    LAUNCH = 5
    CONTACT_LOST = 6
    LOCAL_IO = 7
    BUSY = 8
    INTERRUPTED = 130
    TERMINATED = 143


class UserError(Exception):
    """A problem the user can fix: the message names the file, host or flag, and the fix."""

    exit_code: int = ExitCode.USAGE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InventoryError(UserError):
    """The inventory cannot describe a cluster distrun can run on."""


class PlanError(UserError):
    """The requested job does not fit the cluster (world size, script, flags)."""


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the job failed (a rank exited non-zero, a node was lost), a check failed, 'setup' or "
                     "'partition' failed, 'stop' could not reach a node or had no inventory to reach them with",
    ExitCode.USAGE: "bad usage: an option, inventory, run id or value was refused before anything ran",
    ExitCode.PREFLIGHT: "the preflight refused the run; nothing was started",
    ExitCode.STAGING: "staging failed: the run's files did not reach every node; nothing was started",
    ExitCode.LAUNCH: "the launch failed on a node",
    ExitCode.CONTACT_LOST: "contact lost: no node of the run answers ('train', 'attach', 'logs -f', 'status'); "
                           "the run may go on without distrun",
    ExitCode.LOCAL_IO: "a local file, folder or distrun's own output could not be written or read "
                       "(closed or full stdout, a folder you may not write, a name too long)",
    ExitCode.BUSY: "busy: another run holds the run's hosts (the line names it); nothing was started",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) or stopped by 'distrun stop' from another shell",
    ExitCode.TERMINATED: "terminated (SIGTERM, SIGHUP) while following a run, which was then stopped",
}

# (code, meaning) in order; with the launchers' own, for the help text and the docs (launchers.exit_codes).
EXIT_CODES: tuple[tuple[int, str], ...] = tuple((int(code), MEANINGS[code]) for code in ExitCode)
