"""The hostile-job suite's tally: each attack a cluster test tries through the real CLI is
recorded here with whether it succeeded, and the session ends with one line,
``attacks tried N, succeeded M`` (conftest prints it), then the name of each that succeeded.

A test records an attack after it has tried it for real (planted, ran setup or the run, looked at
the target), so a test that stopped before trying counts nothing: the tally never claims an
attack that was not tried.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

# What a job script does to trace a process of its own uid: its source, put in front of a job
# script that calls try_trace(pid). True when PTRACE_ATTACH took the process (detached again at
# once), else the kernel's reason.
TRY_TRACE = textwrap.dedent(r'''
    import ctypes as _ctypes, os as _os
    _libc = _ctypes.CDLL(None, use_errno=True)
    _libc.ptrace.restype = _ctypes.c_long
    _libc.ptrace.argtypes = [_ctypes.c_long, _ctypes.c_long, _ctypes.c_void_p, _ctypes.c_void_p]

    def try_trace(pid):
        if _libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
            return _os.strerror(_ctypes.get_errno())
        try:
            _os.waitpid(pid, 0x40000000)  # __WALL: the stop the attach caused
        except OSError:
            pass
        _libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
        return True
''')


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
