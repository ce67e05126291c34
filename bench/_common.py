"""Helpers shared by the benchmark scripts: timing, subprocess, machine description.

Benchmarks print numbers and write JSON; they assert nothing (they are not tests).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DISTRUN = str(VENV_BIN / "distrun")


def say(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], *, env: dict | None = None, timeout: float = 1800, cwd: Path = REPO,
        input: str | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run cmd and return (result, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          input=input, check=False)
    return proc, time.monotonic() - t0


def _busy_s() -> float:
    """CPU seconds this machine's cores spent busy since boot (every process: the nodes' too)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    steal_guest = sum(fields[7:]) if len(fields) > 7 else 0  # steal, guest, guest_nice: not this machine's work
    return (sum(fields) - idle - steal_guest) / os.sysconf("SC_CLK_TCK")


def _children_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_cpu(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess[str], float, dict]:
    """run(), and the CPU it took: ``machine_s`` every core's busy time while it ran (the nodes'
    work included, and whatever else ran), ``command_s`` the command's own process tree (the
    processes it waited for), ``cores``."""
    busy, own = _busy_s(), _children_s()
    proc, wall = run(cmd, **kwargs)
    return proc, wall, {"machine_s": round(_busy_s() - busy, 2), "command_s": round(_children_s() - own, 2),
                        "cores": os.cpu_count() or 1}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> dict:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    os_name = "unknown"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "os": os_name,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "load_1min_at_start": round(load, 2),
    }


def child_maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


class CliHome:
    """The distrun CLI as a benchmark runs it: a DISTRUN_HOME of its own under tmp, and a fresh
    ssh ControlPath folder for every command, so no command profits from masters another left."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir(mode=0o700)
        self.n_cp = 0

    def env(self, extra: dict | None = None) -> dict:
        self.n_cp += 1
        cp = self.tmp / f"cp{self.n_cp}"
        cp.mkdir()
        return {**os.environ, "COLUMNS": "200", "DISTRUN_HOME": str(self.home),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp), **(extra or {})}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
