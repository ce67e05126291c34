"""The hostile-job suite's tally: each attack a cluster test tries through the real CLI is
recorded here with whether it succeeded, and the session ends with one line,
``attacks tried N, succeeded M`` (conftest prints it), then the name of each that succeeded.

A test records an attack after it has tried it for real (planted, ran setup or the run, looked at
the target), so a test that stopped before trying counts nothing: the tally never claims an
attack that was not tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    tried: list[str] = field(default_factory=list)
    succeeded: list[str] = field(default_factory=list)

    def record(self, name: str, succeeded: bool) -> bool:
        """Note one attack tried; returns ``succeeded`` so a test can assert on it."""
        self.tried.append(name)
        if succeeded:
            self.succeeded.append(name)
        return succeeded

    def lines(self) -> list[str]:
        if not self.tried:
            return []
        return [f"hostile jobs: attacks tried {len(self.tried)}, succeeded {len(self.succeeded)}"] + \
            [f"  succeeded: {name}" for name in self.succeeded]


TALLY = Tally()
