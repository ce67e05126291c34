"""ssh: every rank host starts its own ranks with torch's variables; the program does its own rendezvous.

For programs that meet by themselves (torch's env:// init, DeepSpeed's pdsh runner): no agent
and no MPI between the ranks. Each rank host's launch script (started over ssh like every
launch script) runs ``ssh-ranks.sh``, which starts the host's ``slots`` ranks through the rank
wrapper with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and
MASTER_PORT, writes each rank's output to ``ranks/<rank>/stdout`` in the attempt's folder (and
to the launcher's log, which the run follows), waits for all of them and ends with the exit
code of the rank that failed first. A failed rank stops the host's other ranks (TERM), as
torchrun's agent does: they would otherwise wait for it in their next collective until a
timeout. A TERM to the script goes on to its ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distrun.launchers.base import Launcher
from distrun.planning import containers

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan, RankHost

SCRIPT = "ssh-ranks.sh"
RANKS = "ranks"  # in the attempt's folder: ranks/<rank>/stdout, each rank's output
FAILED_RANK = r"distrun ssh: rank (\d+) ended with exit code [1-9]"

# Arguments: FIRST_RANK SLOTS PROGRAM...; the launch script exports the rest. Bash 4.3 or later
# (exec {fd}>). Run in the attempt's folder, as the launch script does.
_BODY = r"""first=$1 slots=$2
shift 2
export LOCAL_WORLD_SIZE="$slots"
declare -A running=()
stopping=0
stop_ranks() {
  stopping=1
  for pid in "${!running[@]}"; do kill -TERM "$pid" 2>/dev/null || :; done
}
trap stop_ranks TERM
tees=()
for ((i = 0; i < slots; i++)); do
  rank=$((first + i))
  mkdir -p "ranks/$rank" || exit 3
  # Each rank's output goes to its own log and to this script's output (the launcher's log).
  exec {out}> >(exec tee "ranks/$rank/stdout")
  tees+=("$!")
  RANK=$rank LOCAL_RANK=$i "$@" < /dev/null >&"$out" 2>&1 &
  running[$!]=$rank
  exec {out}>&-
  [ "$stopping" = 0 ] || kill -TERM "$!" 2>/dev/null || :
done
rc=0
# A rank that ended no longer answers kill -0 once bash has reaped it, and 'wait PID' then gives
# its saved exit code ('wait -n' can lose one to a TERM that interrupts it).
while ((${#running[@]} > 0)); do
  for pid in "${!running[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"
    code=$?
    rank=${running[$pid]}
    unset "running[$pid]"
    if [ "$code" != 0 ] && [ "$rc" = 0 ]; then
      rc=$code
      if [ "$stopping" = 0 ]; then
        echo "distrun ssh: rank $rank ended with exit code $code; stopping this host's other ranks" >&2
        stop_ranks
      fi
    fi
  done
  ((${#running[@]} == 0)) || sleep 0.2
done
# The tees end once the ranks' output is closed: wait for them so that the logs are complete.
for pid in "${tees[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
done
exit "$rc"
"""


def first_ranks(plan: JobPlan) -> dict[str, tuple[int, int]]:
    """Host name -> (its node rank, its first rank): ranks fill the plan's hosts in order."""
    out: dict[str, tuple[int, int]] = {}
    first = 0
    for node_rank, host in enumerate(plan.placement.hosts):
        out[host.name] = (node_rank, first)
        first += int(host.slots)
    return out


class Ssh(Launcher):
    name = "ssh"
    summary = ("every rank host starts its ranks with torch's RANK/WORLD_SIZE/MASTER_ADDR variables; "
               "the program does its own rendezvous")
    run_dir_files = (SCRIPT,)
    attempt_files = (RANKS,)
    rank_log_files = (f"{RANKS}/*/stdout",)
    takes_args = False
    container_per_rank = True
    failed_rank_patterns = (FAILED_RANK,)

    def files(self, plan: JobPlan) -> dict[str, str]:
        # With an image, one container per rank, as under mpirun (containers.py).
        script = (f"#!/bin/bash\n# distrun run {' '.join(plan.run_id.split())}: starts one rank host's ranks "
                  f"(ssh launcher). Generated; do not edit.\n{_BODY}")
        return {SCRIPT: script, **containers.files(plan, per_rank=self.container_per_rank, prefixes=self.env_prefixes)}

    def launch_hosts(self, plan: JobPlan) -> list[RankHost]:
        return list(plan.placement.hosts)

    def rank_order(self, hosts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
        return list(hosts)

    def command(self, plan: JobPlan, host: RankHost) -> list[str]:
        _, first = first_ranks(plan)[host.name]
        script = f"{plan.run_dir.rstrip('/')}/{SCRIPT}"
        inside = [containers.script_path(plan)] if plan.launch.container else []
        return ["/bin/bash", script, str(first), str(int(host.slots)), plan.wrapper, *inside, *plan.program.argv]

    def environment(self, plan: JobPlan, host: RankHost) -> list[tuple[str, str]]:
        # The plan's env holds DISTRUN_RUN_ID, which tags the script and its ranks for 'distrun stop'.
        node_rank, _ = first_ranks(plan)[host.name]
        placed = plan.placement
        env = {**dict(plan.program.env), "MASTER_ADDR": str(placed.master_addr), "MASTER_PORT": str(int(placed.master_port)),
               "WORLD_SIZE": str(sum(int(h.slots) for h in placed.hosts)), "NODE_RANK": str(node_rank),
               "LOCAL_WORLD_SIZE": str(int(host.slots))}
        return sorted(env.items())

    def needs(self, plan: JobPlan) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        return ({plan.launch.container.runtime: [plan.launch.container.runtime]} if plan.launch.container else {}), {}

    def rank_log(self, rank: int, host: str, local_rank: int) -> str:
        return f"{RANKS}/{int(rank)}/stdout"

