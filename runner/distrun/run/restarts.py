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
from functools import cache
from typing import Any

from distrun.inventory.cluster import Cluster
from distrun.planning.jobplan import JobPlan
from distrun.transport import nodeprog

RULE = "restartrule"  # role job's files/restartrule.py: the rule, for the follower and the supervisor


@dataclass(frozen=True)
class Decision:
    """Where the next attempt runs: the hosts left out (empty: the same hosts), or why it cannot."""

    exclude: frozenset[str] = frozenset()
    refused: str = ""

    @property
    def ok(self) -> bool:
        return not self.refused


def rule() -> dict[str, Any]:
    """The restart rule's namespace (role job's files/restartrule.py), the one home the head's
    supervisor of a detached mpirun run carries too (supervise.py)."""
    return dict(_rule())


@cache
def _rule() -> dict[str, Any]:
    path = nodeprog.part_path(RULE)
    space: dict[str, Any] = {"__name__": "distrun_restartrule"}
    exec(compile(path.read_text(), str(path), "exec"), space)  # noqa: S102 - the project's own file
    return space


def decide(cluster: Cluster, plan: JobPlan, np: int | None, *, failed: str | None, lost: Iterable[str],
           exclude_failed: bool) -> Decision:
    """The next attempt's hosts after a failure, by the restart rule (restartrule.py): a lost node
    is left out when the user allowed it (--exclude-failed), a failed node too when the job still
    fits without it; the head, which starts the job, is never left out."""
    said = _rule()["restart_hosts"]([(n.name, n.slots) for n in cluster.workers], [h.name for h in plan.placement.hosts],
                                    cluster.head.name, np, plan.placement.world_size, failed, list(lost), exclude_failed)
    return Decision(frozenset(said["exclude"]), said["refused"])
