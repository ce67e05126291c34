"""One attempt of a run as a state machine: the steps it takes on its way to running ranks, the
end it comes to, and the events that move it (the methods of ``Attempt``). The threads of a
start report into it as things happen: the claim's thread (its answer), the upload's (the run's
files arrived), the playbook's event reader (judged, staged), the launchers' start (launched,
or launch failed), and the runner itself (refused, staging failed, interrupted).

``NEXT`` is the transition table: the states that may follow each one. The claim, the upload
and the judge answer while run.yml probes, so those three come in any order (each reports before
the gate file run.yml's stage step waits for says so: none is told after staged); launched or
launch failed come only right after staged, and nothing follows an end: a second end, or news
that arrives after the end (a thread that lost the race), is not recorded. The states reached,
each with its seconds since the attempt was planned, go to the record as ``attempts/<n>/states.json``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from enum import StrEnum

from distrun.errors import ExitCode


class Step(StrEnum):
    """Where an attempt got to on its way to running ranks."""

    PLANNED = "planned"
    CLAIMED = "claimed"
    UPLOADED = "uploaded"
    JUDGED = "judged"
    STAGED = "staged"


class End(StrEnum):
    """How an attempt's start ended: its ranks launched, or why they never did."""

    LAUNCHED = "launched"
    REFUSED = "refused"
    STAGING_FAILED = "staging failed"
    LAUNCH_FAILED = "launch failed"
    INTERRUPTED = "interrupted"


State = Step | End
ORDER: tuple[State, ...] = (*Step, *End)
_BEFORE_STAGING = frozenset({End.REFUSED, End.STAGING_FAILED, End.INTERRUPTED})

NEXT: Mapping[State, frozenset[State]] = {
    Step.PLANNED: frozenset({Step.CLAIMED, Step.UPLOADED, Step.JUDGED, Step.STAGED}) | _BEFORE_STAGING,
    Step.CLAIMED: frozenset({Step.UPLOADED, Step.JUDGED, Step.STAGED}) | _BEFORE_STAGING,
    Step.UPLOADED: frozenset({Step.CLAIMED, Step.JUDGED, Step.STAGED}) | _BEFORE_STAGING,
    Step.JUDGED: frozenset({Step.CLAIMED, Step.UPLOADED, Step.STAGED}) | _BEFORE_STAGING,
    Step.STAGED: frozenset({End.LAUNCHED, End.LAUNCH_FAILED, End.INTERRUPTED}),
    **{end: frozenset() for end in End},
}

# The exit code of an attempt whose start ended there (a refusal carries its own: busy hosts or
# the preflight's verdict).
EXIT_CODES: Mapping[End, ExitCode] = {
    End.LAUNCHED: ExitCode.OK,
    End.REFUSED: ExitCode.PREFLIGHT,
    End.STAGING_FAILED: ExitCode.STAGING,
    End.LAUNCH_FAILED: ExitCode.LAUNCH,
    End.INTERRUPTED: ExitCode.INTERRUPTED,
}


class Attempt:
    """The states one attempt reached, each once, with its time since it was planned; its end
    and why. Every method but the readers is an event; each answers whether it was recorded."""

    def __init__(self, restart: int) -> None:
        self.restart = restart
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._reached: dict[State, float] = {Step.PLANNED: 0.0}
        self._last: State = Step.PLANNED
        self.why = ""  # the refusal or failure that ended it
        self.exit_code: int = ExitCode.OK  # distrun's exit code for its end (a refusal's own)

    # --- the events -----------------------------------------------------------------------

    def claim_answered(self, at: float | None = None) -> bool:
        """The run holds its hosts (or may share them): run.yml's stage step may go on."""
        return self._reach(Step.CLAIMED, at=at)

    def uploaded(self, at: float | None = None) -> bool:
        """The run's files reached every node that stages them."""
        return self._reach(Step.UPLOADED, at=at)

    def judged(self) -> bool:
        """The preflight's judge gave its verdict (passed, or failing the nodes it blames)."""
        return self._reach(Step.JUDGED)

    def staged(self) -> bool:
        """Every node that stages unpacked the run: the launchers may start."""
        return self._reach(Step.STAGED)

    def launched(self) -> bool:
        """Every launcher started: the ranks run."""
        return self._reach(End.LAUNCHED)

    def launch_failed(self, why: str) -> bool:
        return self._reach(End.LAUNCH_FAILED, why, ExitCode.LAUNCH)

    def refused(self, why: str, exit_code: int = ExitCode.PREFLIGHT) -> bool:
        """Refused before anything started: the preflight's verdict, or hosts another run holds."""
        return self._reach(End.REFUSED, why, exit_code)

    def staging_failed(self, why: str) -> bool:
        return self._reach(End.STAGING_FAILED, why, ExitCode.STAGING)

    def interrupted(self, why: str = "", exit_code: int = ExitCode.INTERRUPTED) -> bool:
        """Ctrl-C, a signal, or 'distrun stop' from another shell, before every launcher started."""
        return self._reach(End.INTERRUPTED, why, exit_code)

    # --- the machine ----------------------------------------------------------------------

    def _reach(self, state: State, why: str = "", exit_code: int | None = None, at: float | None = None) -> bool:
        t = round(max(0.0, (at if at is not None else time.monotonic()) - self._t0), 3)
        with self._lock:
            if state in self._reached or state not in NEXT[self._last]:
                return False
            self._reached[state] = max(t, self._reached[self._last])
            self._last = state
            if isinstance(state, End):
                self.why = why
                self.exit_code = EXIT_CODES[state] if exit_code is None else exit_code
            return True

    # --- what it says ---------------------------------------------------------------------

    @property
    def end(self) -> End | None:
        return self._last if isinstance(self._last, End) else None

    @property
    def state(self) -> State:
        """The last state reached."""
        return self._last

    def reached(self, state: State) -> bool:
        return state in self._reached

    def to_json(self) -> str:
        with self._lock:
            order = list(self._reached.items())  # in the order reached, their times never earlier
            end = self.end
            return json.dumps({"attempt": self.restart, "states": [{"state": s.value, "s": t} for s, t in order],
                               "end": end.value if end else None, "why": self.why}, indent=2) + "\n"
