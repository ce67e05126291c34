"""The attempt's ssh certificate: asked of root on the head, whose user CA signs it (role job's
``files/sign.py``), and the two files it becomes in the attempt's folder on the nodes.

The certificate names the run's hosts only (``<user>@<host>``: each node's sshd takes it only
where it names that node), their addresses only (``source-address``), minutes only, and forces
the relay's mesh verb. mpirun's daemons and the sync mode's copies log in with it; a job can read
it, and it opens nothing else, nowhere else, for no longer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from distrun import paths
from distrun.errors import UserError
from distrun.inventory.cluster import Cluster, load_facts
from distrun.launchers import launcher_named
from distrun.planning.jobplan import JobPlan
from distrun.transport import nodeprog, rundir
from distrun.transport.remote import node_command, run_each

# How long an attempt's certificate opens its hosts, from its signing (DISTRUN_RUN_CERT_MINUTES):
# enough for the stage step's copies and mpirun's start, a --prepare included.
CERT_MINUTES = 60
SIGN_TIMEOUT_S = 60


def minutes() -> int:
    raw = os.environ.get("DISTRUN_RUN_CERT_MINUTES", "")
    if not raw:
        return CERT_MINUTES
    if not raw.isdigit() or not 1 <= int(raw) <= 1440:
        raise UserError(f"DISTRUN_RUN_CERT_MINUTES={raw!r}: give a whole number of minutes from 1 to 1440")
    return int(raw)


def addresses(cluster: Cluster, hosts: list[str]) -> list[str]:
    """Every address the run's hosts may log in from: each one's inventory address and the IPv4
    addresses its cached facts list."""
    cache = paths.fact_cache_dir(cluster.source)
    nodes = {n.name: n for n in cluster.nodes}
    out: list[str] = []
    for host in hosts:
        facts = load_facts(cache, host) or {}
        found = facts.get("ansible_all_ipv4_addresses") or (facts.get("ansible_facts") or {}).get("all_ipv4_addresses") or []
        out += [str(a) for a in found if isinstance(a, str)]
        if host in nodes and nodes[host].address:
            out.append(nodes[host].address)
    return list(dict.fromkeys(out))


def signer(cluster: Cluster) -> str:
    """The node whose root keeps the user CA: the head, or the inventory's ssh_mesh_key_host."""
    named = cluster.head.hostvars.get("ssh_mesh_key_host")
    return str(named) if isinstance(named, str) and named else cluster.head.name


def config(cluster: Cluster, plan: JobPlan, hosts: list[str]) -> dict:
    restrict = cluster.head.hostvars.get("ssh_mesh_restrict_key", True)
    return {"run": plan.run_id, "attempt": str(plan.attempt.restart), "user": plan.launch.user, "hosts": hosts,
            "addresses": addresses(cluster, hosts), "minutes": minutes(),
            "forced": nodeprog.mesh_command() if restrict not in (False, "false", "False", "no") else ""}


def answer_files(plan: JobPlan, said: Mapping) -> dict[str, str]:
    """The run files (relative to the run directory) of sign.py's answer: key and certificate."""
    return {rundir.in_attempt(plan, rundir.MESH_KEY): str(said["key"]),
            rundir.in_attempt(plan, rundir.MESH_CERT): str(said["cert"])}


def needed(cluster: Cluster, plan: JobPlan) -> bool:
    """Whether the attempt logs in between its hosts: its launcher does (mpirun's daemons), or
    the sync mode's stage step pulls from the head (the workdir, a partition, checkpoints)."""
    hosts = set([plan.placement.head.name, *plan.placement.reached_hosts])
    return len(hosts) > 1 and (launcher_named(plan.launch.launcher).logs_in or cluster.shared_fs_mode == "sync")


def issue(cluster: Cluster, plan: JobPlan) -> dict[str, str]:
    """The attempt's key and certificate as run files, or {} where the run logs in nowhere
    (needed) or the head's connection is not root (ssh then uses the user's own keys).
    A CA that is missing or cannot sign: UserError naming the node and the fix."""
    if not needed(cluster, plan):
        return {}
    hosts = list(dict.fromkeys([plan.placement.head.name, *plan.placement.reached_hosts]))
    node = signer(cluster)
    nodes = {n.name: n for n in cluster.nodes}
    if node not in nodes:
        raise UserError(f"ssh_mesh_key_host {node!r} is not a node of the inventory: set it to the head")
    done = run_each({node: nodes[node]}, {node: node_command(plan.launch.user, "sign", config(cluster, plan, hosts), "sign",
                                                             people=plan.launch.people)}, SIGN_TIMEOUT_S)[node]
    said = nodeprog.answer(done.out, "sign")
    if said is None:
        raise UserError(f"{node}: the run's ssh certificate was not issued: {done.last_line()}")
    if said.get("no_root"):
        return {}
    if said.get("error"):
        raise UserError(f"{node}: the run's ssh certificate was not issued: {said['error']}")
    return answer_files(plan, said)
