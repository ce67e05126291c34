"""A try of mpirun as the head's supervisor (supervise.py, composed after this file) runs it: its
command line on other hosts, how it ended, the probe of the other hosts, the certificate's end.
Standard library only, Python 3.9 or newer; pure but for the probe and the certificate's read.
"""

import signal
import subprocess
import time

PROBE_S = 10  # how long a host's probe may take before it counts as not answering


def with_hosts(argv: list, hostfile: str, world_size: int) -> list:
    """mpirun's command line on another hostfile and world size (its ``--hostfile`` and ``-np``)."""
    out = list(argv)
    for flag, value in (("--hostfile", hostfile), ("-np", str(int(world_size)))):
        if flag not in out or out.index(flag) + 1 >= len(out):
            raise ValueError(f"mpirun's command line has no {flag}")
        out[out.index(flag) + 1] = value
    return out


def with_env(argv: list, env: dict) -> list:
    """mpirun's ``-x NAME=VALUE`` for each name of env given env's value (the restart's)."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == "-x" and out[i + 1].split("=", 1)[0] in env:
            name = out[i + 1].split("=", 1)[0]
            out[i + 1] = f"{name}={env[name]}"
    return out


def hostfile_without(text: str, drop: "set | list") -> str:
    """The hostfile's text without the lines of the hosts dropped (comments and order kept)."""
    drop = set(drop)
    return "".join(line for line in text.splitlines(True)
                   if not (line.split() and not line.lstrip().startswith("#") and line.split()[0] in drop))


def probe(command: list, hosts: list, timeout: float = PROBE_S) -> dict:
    """host -> whether it answered an ssh login as the training user over the mesh, all at once."""
    procs = {}
    for host in hosts:
        try:
            procs[host] = subprocess.Popen([*command, host, "true"], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            procs[host] = None
    answered = {}
    deadline = time.monotonic() + timeout
    for host, proc in procs.items():
        if proc is None:
            answered[host] = False
            continue
        try:
            answered[host] = proc.wait(timeout=max(0.1, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            answered[host] = False
    return answered


def cert_end(cert: str) -> "float | None":
    """When the attempt's ssh certificate stops opening the hosts (epoch seconds; None: unknown)."""
    try:
        said = subprocess.run(["ssh-keygen", "-L", "-f", cert], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in said.stdout.splitlines():
        words = line.split()
        if words[:1] == ["Valid:"] and "to" in words:
            try:
                return time.mktime(time.strptime(words[words.index("to") + 1], "%Y-%m-%dT%H:%M:%S"))
            except (IndexError, ValueError):
                return None
    return None


def ended(returncode: int) -> dict:
    """How a try ended: its exit code (128 + N for signal N, as a shell says it) and the signal."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name[3:]
        except ValueError:
            name = str(-returncode)
        return {"rc": 128 - returncode, "signal": name}
    return {"rc": returncode, "signal": None}
