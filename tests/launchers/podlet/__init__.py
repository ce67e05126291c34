"""podlet: a launcher that lives outside distrun, for the tests (registered by one line:
``DISTRUN_LAUNCHERS=tests.launchers.podlet:Podlet``), shaped like a Kubernetes job on plain
nodes. The run directory holds one manifest (``podlet.json``: a pod per rank, its node, its
rank) and a kubelet (``podlet.py``, kubelet.py's text); each rank host's launch script runs the
kubelet, which starts that node's pods through the rank wrapper with torch's variables, keeps
each pod's log in the attempt's ``pods/`` folder (and on its own output, which the run follows),
stops its other pods when one fails, and ends with the exit code of its pods' phases (PHASES).

It owns its whole axis as any launcher does, by declaration: the hosts it reaches (every rank
host), its files and attempt files, its own exit code (an evicted pod), how a failed rank is
found, its phases mapped inside it. No file of distrun names it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.launchers.base import Launcher

from .kubelet import PHASES  # a pod's phase when it ended -> the kubelet's exit code

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan, RankHost

MANIFEST = "podlet.json"
KUBELET = "podlet.py"
PODS = "pods"  # in the attempt's folder: pods/<rank>.log, pods/<node>.status
FAILED_POD = r"podlet: pod rank (\d+) (?:Failed|Evicted)"


class Podlet(Launcher):
    name = "podlet"
    summary = "a kubelet on every rank host starts that node's pods (ranks) from one manifest (tests only)"
    run_dir_files = (MANIFEST, KUBELET)
    attempt_files = (PODS,)
    rank_log_files = (f"{PODS}/*.log",)
    takes_args = False
    failed_rank_patterns = (FAILED_POD,)
    exit_codes = {PHASES["Evicted"]: "a pod was evicted: a rank was killed by a signal"}

    def files(self, plan: JobPlan) -> dict[str, str]:
        pods, rank = [], 0
        for node_rank, host in enumerate(plan.placement.hosts):
            for local in range(int(host.slots)):
                pods.append({"rank": rank, "node": host.name, "node_rank": node_rank, "local_rank": local})
                rank += 1
        manifest = {"kind": "Job", "run": plan.run_id, "command": [plan.wrapper, *plan.program.argv], "pods": pods}
        kubelet = (Path(__file__).parent / "kubelet.py").read_text()
        return {MANIFEST: json.dumps(manifest, indent=2) + "\n", KUBELET: kubelet}

    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        return list(plan.placement.hosts)

    def rank_order(self, hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
        return list(hosts)

    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        run_dir = plan.run_dir.rstrip("/")
        return ["python3", "-I", f"{run_dir}/{KUBELET}", f"{run_dir}/{MANIFEST}", host.name]

    def environment(self, plan: JobPlan, host: RankHost) -> list[tuple[str, str]]:
        placed = plan.placement
        env = {**dict(plan.program.env), "MASTER_ADDR": str(placed.master_addr), "MASTER_PORT": str(int(placed.master_port)),
               "WORLD_SIZE": str(sum(int(h.slots) for h in placed.hosts)), "LOCAL_WORLD_SIZE": str(int(host.slots))}
        return sorted(env.items())

    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        return f"{PODS}/{int(rank)}.log"

    def exit_code(self, rc: int) -> int:
        return rc if rc in PHASES.values() else 1
