"""One attempt's plan, made once: the cluster without the workers a restart leaves out, the
interfaces chosen from the cached facts, the ranks' variables (computed here, once, for the plan's
names and the run's env.sh alike), and the plan; the hosts the run holds for it. The run claims
its hosts from its first attempt's plan (run/busy.py), and that attempt launches the same plan."""

from __future__ import annotations

from dataclasses import dataclass

from distrun.inventory.cluster import Cluster
from distrun.planning.jobplan import JobPlan
from distrun.planning.network import NetworkChoice, network
from distrun.planning.plan import build_plan
from distrun.planning.request import JobRequest, environment, without


@dataclass(frozen=True)
class AttemptPlan:
    cluster: Cluster  # the workers this attempt may use
    network: NetworkChoice | None
    env: dict[str, str]  # every variable of env.sh (the plan holds their names only)
    plan: JobPlan

    @property
    def hosts(self) -> list[str]:
        """The hosts the attempt reaches: the head first, then the rank hosts distrun contacts."""
        return list(dict.fromkeys([self.cluster.head.name, *self.plan.placement.reached_hosts]))


def plan_attempt(request: JobRequest, cluster: Cluster, run_id: str, *, restart: int = 0,
                 exclude: frozenset[str] = frozenset()) -> AttemptPlan:
    """Plan attempt ``restart`` of ``request`` on ``cluster`` without the workers in ``exclude``."""
    used = without(cluster, exclude) if exclude else cluster
    net = network(used)
    env = environment(request, used)
    return AttemptPlan(used, net, env, build_plan(used, request, run_id=run_id, env=env, network=net, restart=restart))
