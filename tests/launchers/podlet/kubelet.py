"""podlet's kubelet (the launcher's node side, copied into the run directory as podlet.py):
``python3 -I podlet.py MANIFEST NODE``, in the attempt's folder. Starts NODE's pods of the
manifest, each with RANK, LOCAL_RANK and NODE_RANK (the launch script gives the rest), its
output to pods/<rank>.log and to this program's own output; when a pod ends other than
Succeeded, the node's other pods are stopped (TERM). Exits with the code of the first pod that
did not succeed (its phase in PHASES), else 0; a TERM to it goes on to the pods. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

PHASES = {"Succeeded": 0, "Failed": 1, "Evicted": 12}


def phase(rc: int) -> str:
    return "Succeeded" if rc == 0 else "Evicted" if rc < 0 else "Failed"


def main(manifest_path: str, node: str) -> int:
    with open(manifest_path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    mine = [p for p in manifest["pods"] if p["node"] == node]
    os.makedirs("pods", exist_ok=True)
    lock = threading.Lock()
    running: dict[int, subprocess.Popen[bytes]] = {}
    copies: list[threading.Thread] = []

    def copy(rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with open(f"pods/{rank}.log", "wb") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                with lock:
                    sys.stdout.buffer.write(line)
                    sys.stdout.buffer.flush()

    def stop(*_: object) -> None:
        for proc in list(running.values()):
            if proc.poll() is None:
                proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    for pod in mine:
        env = {**os.environ, "RANK": str(pod["rank"]), "LOCAL_RANK": str(pod["local_rank"]),
               "NODE_RANK": str(pod["node_rank"])}
        proc = subprocess.Popen(manifest["command"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        running[pod["rank"]] = proc
        copies.append(threading.Thread(target=copy, args=(pod["rank"], proc), daemon=True))
        copies[-1].start()
    ended: dict[int, str] = {}
    code = 0
    while len(ended) < len(running):
        for rank, proc in running.items():
            rc = proc.poll()
            if rc is None or rank in ended:
                continue
            ended[rank] = phase(rc)
            if ended[rank] != "Succeeded" and code == 0:
                code = PHASES[ended[rank]]
                print(f"podlet: pod rank {rank} {ended[rank]} (exit {rc}); stopping node {node}'s other pods",
                      file=sys.stderr, flush=True)
                stop()
        time.sleep(0.1)
    for thread in copies:
        thread.join()
    with open(f"pods/{node}.status", "w", encoding="utf-8") as fh:
        json.dump({"node": node, "pods": {str(r): p for r, p in sorted(ended.items())}}, fh)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
