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
