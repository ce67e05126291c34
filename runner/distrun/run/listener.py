"""What a run reports as it goes (train, attach): the runner calls a Listener, the UI implements
it (``ui_run.TrainView``); a bare Listener runs silently."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distrun.project.workdir import Scan, SyncStats
    from distrun.run.diagnosis import RunSummary
    from distrun.run.liveness import ClusterState
    from distrun.store.runs import Run
    from distrun.transport.playbook_events import PlaybookEvent, PlaybookResult

EventHandler = Callable[["PlaybookEvent"], None]


class Listener:
    """Every method does nothing here; the UI overrides them."""

    def started(self, run: Run) -> None:
        """The run record exists."""

    def playbook(self, title: str, hosts: list[str]) -> AbstractContextManager[EventHandler | None]:
        """A playbook is about to run on hosts: the context is open while it runs and gives its event handler."""
        return contextlib.nullcontext(None)

    def playbook_failed(self, result: PlaybookResult, elapsed: float) -> None:
        """A playbook failed in a way no later message explains."""

    def replanning(self) -> None:
        """The nodes' network changed since the plan was made: planning again."""

    def waiting(self, text: str) -> None:
        """train --wait: the run waits for hosts or GPUs another run holds (one line, said once)."""

    def line(self, text: str) -> None:
        """One line of the head launcher's output, as it comes."""

    def workdir_synced(self, host: str, scan: Scan, stats: SyncStats) -> None:
        """--workdir: the project folder reached the head; what rsync sent."""

    def prepare_started(self, host: str, argv: tuple[str, ...]) -> None:
        """--prepare starts on the head."""

    def prepare_line(self, text: str) -> None:
        """One line of --prepare's output, as it comes."""

    def node_failed(self, reason: str) -> None:
        """A node ended the run (its launcher failed, or the node was lost): every rank is being stopped."""

    def restarting(self, restart: int, max_restarts: int, hosts: list[str], reason: str) -> None:
        """The run failed and restarts (the restart-th time of max_restarts) on hosts."""

    def not_restarting(self, reason: str) -> None:
        """The run failed with restarts left, yet cannot restart (why)."""

    def detached(self, run: Run, state: ClusterState) -> None:
        """Every rank started and the run goes on by itself: nothing follows it now."""

    def attached(self, run: Run) -> None:
        """'distrun attach' follows the run from here on."""

    def already_ended(self, run: Run) -> None:
        """'distrun attach' found the run ended and collected: nothing to follow."""

    def contact_lost(self, run: Run, reason: str) -> None:
        """No launch host answers any more: the run may go on without us; the record stays open."""

    def interrupted(self) -> None:
        """Ctrl-C: every rank is being stopped."""

    def warn(self, message: str) -> None:
        """Something went wrong that does not change the run's result (logs not collected)."""

    def finished(self, summary: RunSummary) -> None:
        """The run ended and its record is complete."""
