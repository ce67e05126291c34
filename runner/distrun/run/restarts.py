"""Restarts: after a failed rank or a lost node, on which hosts a run starts again.

Each attempt writes its launcher, rank and marker files into a folder of its own in the run
directory (rundir.py): nothing is moved between attempts, and a launcher of the failed attempt
that ends late writes only into its own folder.

The job itself resumes: every rank gets DISTRUN_RESTART (0, 1, ...) and DISTRUN_CHECKPOINT_DIR,
a folder per run in the shared folder that survives restarts (plan.py). A restart re-plans on
the hosts that are left and runs run.yml again (preflight, stage), then launches; in sync mode the
stage step first copies the head's checkpoints to every node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distrun.inventory.cluster import Cluster
from distrun.planning.jobplan import JobPlan


@dataclass(frozen=True)
class Decision:
    """Where the next attempt runs: the hosts left out (empty: the same hosts), or why it cannot."""

    exclude: frozenset[str] = frozenset()
    refused: str = ""

    @property
    def ok(self) -> bool:
        return not self.refused


def decide(cluster: Cluster, plan: JobPlan, np: int | None, *, failed: str | None, lost: Iterable[str],
           exclude_failed: bool) -> Decision:
    """The next attempt's hosts after a failure. A lost node is left out when the user allowed it
    (--exclude-failed), a failed node too when the job still fits without it; the head, which
    starts the job, is never left out."""
    lost = set(lost)
    head = cluster.head.name
    if head in lost:
        return Decision(refused=f"the head node {head} is lost; a run cannot go on without it")
    if lost and not exclude_failed:
        return Decision(refused=f"{', '.join(sorted(lost))} cannot be reached; restart with --exclude-failed "
                                "to go on without it, or bring it back and run the job again")
    used = {h.name for h in plan.placement.hosts}
    drop = set(lost)
    if exclude_failed and failed and failed != head and failed in used:
        drop.add(failed)
    left = [n for n in cluster.workers if n.name not in drop]
    slots = sum(n.slots for n in left)
    need = plan.placement.world_size if np is not None else 1
    if slots >= need and left:
        return Decision(frozenset(drop))
    if drop - lost and slots + sum(n.slots for n in cluster.workers if n.name in drop - lost) >= need:
        return Decision(frozenset(lost))  # the failed node is reachable: the job fits only with it
    shown = ", ".join(sorted(drop))
    return Decision(refused=f"--np {np} needs {need} slots; without {shown} only {slots} are left")
