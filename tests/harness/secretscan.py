"""Find secrets where distrun keeps its records: run directories, ansible-runner artifacts, logs,
the fact cache. Used by the cluster suite's last test and proven on planted files by a unit test.

What counts as a secret:
* any PEM/OpenSSH private key block (``-----BEGIN ... PRIVATE KEY-----``);
* known secret material passed in by the caller: the test cluster's admin private key, the
  training user's mesh key, a munge key, a vault password. Each is matched by every 32-character
  piece of its base64 body too, so a key that was re-wrapped, quoted in JSON ("\\n" escapes) or cut
  still shows up.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PRIVATE_KEY_RE = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
CHUNK = 32


@dataclass(frozen=True)
class Finding:
    path: Path
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def key_fragments(secret: bytes | str, label: str) -> list[tuple[bytes, str]]:
    """Needles for one secret: its PEM body (or raw bytes) cut into CHUNK-long pieces."""
    data = secret.encode() if isinstance(secret, str) else secret
    body_lines = [ln.strip() for ln in data.splitlines() if ln.strip() and not ln.startswith(b"-----")]
    if body_lines and data.lstrip().startswith(b"-----"):
        body = b"".join(body_lines)
    else:
        # Binary (a munge key) or a bare password: search the raw bytes and their base64 form.
        body = data.strip()
        needles = [(body, label)] if len(body) >= 8 else []
        body = base64.b64encode(data)
        needles += [(body[i:i + CHUNK], label) for i in range(0, max(len(body) - CHUNK, 0) + 1, CHUNK)
                    if len(body[i:i + CHUNK]) == CHUNK]
        return needles
    return [(body[i:i + CHUNK], label) for i in range(0, len(body) - CHUNK + 1, CHUNK)]


def scan(roots: Iterable[Path], secrets: Sequence[tuple[bytes | str, str]] = ()) -> list[Finding]:
    """Every file under ``roots`` that holds a private key block or a piece of a known secret."""
    needles = [n for secret, label in secrets for n in key_fragments(secret, label)]
    findings: list[Finding] = []
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        for path in files:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            # JSON and YAML escape newlines; undo that so a quoted key still matches.
            flat = data.replace(b"\\n", b"\n").replace(b"\\r", b"")
            if PRIVATE_KEY_RE.search(flat):
                findings.append(Finding(path, "a private key block"))
                continue
            joined = re.sub(rb"\s+", b"", flat)
            for needle, label in needles:
                if needle in flat or needle in joined:
                    findings.append(Finding(path, f"material of {label}"))
                    break
    return findings


def loose_modes(home: Path) -> list[str]:
    """The gates of distrun's state that must be 0700: the state dir, runs/, facts/, each run
    directory and its ansible-runner private data dir. Everything else lies beneath one of them
    (ansible-runner makes its artifact folders 0755, which is fine only inside a 0700 gate)."""
    gates = [home, home / "runs", home / "facts"]
    for run in sorted((home / "runs").glob("*")):
        if run.is_dir():
            gates += [run] + ([run / "ansible"] if (run / "ansible").is_dir() else [])
    bad = []
    for d in gates:
        if d.is_dir():
            mode = d.stat().st_mode & 0o777
            if mode != 0o700:
                bad.append(f"{d}: mode {mode:04o}, want 0700")
    return bad
