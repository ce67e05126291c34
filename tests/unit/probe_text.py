"""The preflight's probe as role preflight's probe task ships it: the one recipe's text
(distrun.transport.nodeprog: role distrun's switch of a root process's filesystem identity, then
the probe's own files, one source)."""

from __future__ import annotations

from distrun.transport import nodeprog


def probe_text() -> str:
    return nodeprog.text("probe")
