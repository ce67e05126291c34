# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The ports check, on the head: who listens on each port or range the run's launchers open."""

import re
import subprocess


def _in(port: int, spec: int | str) -> bool:
    if isinstance(spec, int) or str(spec).isdigit():
        return port == int(spec)
    lo, _, hi = str(spec).partition("-")
    return int(lo) <= port <= int(hi)


def probe_ports(specs: list) -> dict[str, dict]:
    """Every configured port or range -> who listens there (ss as root shows the process)."""
    try:
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=20, check=False).stdout
    except FileNotFoundError:
        return {str(s): {"ok": False, "detail": "ss not found (install iproute2)"} for s in specs}
    listeners = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        port = fields[3].rsplit(":", 1)[-1]
        if not port.isdigit():
            continue
        procs = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        who = ", ".join(f"{n} (pid {p})" for n, p in dict.fromkeys(procs)) or "a process of another user"
        listeners.append((int(port), who))
    result = {}
    for spec in specs:
        single = isinstance(spec, int) or str(spec).isdigit()
        taken = sorted({(f"by {who}" if single else f"{p} by {who}") for p, who in listeners if _in(p, spec)})
        result[str(spec)] = ({"ok": True, "detail": "free"} if not taken
                             else {"ok": False, "detail": "in use " + "; ".join(taken)})
    return result
