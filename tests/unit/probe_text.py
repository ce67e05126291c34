"""The preflight's probe as role preflight's probe task ships it: role distrun's switch of a root
process's filesystem identity, then the probe's own files, one source."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "preflight" / "files"
PARTS = (REPO / "roles" / "distrun" / "module_utils" / "distrun_fsuser.py", FILES / "netprobe.py",
         FILES / "imageprobe.py", FILES / "userprobe.py", FILES / "probe.py")


def probe_text() -> str:
    return "".join(p.read_text() for p in PARTS)
