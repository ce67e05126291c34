"""The commands the runner sends to a node for one attempt's launcher: start it, follow it (the
head's log, or only its end), stop the run. Each is one call of a node program (launch.py,
attempt.py, node.py under roles/job/files), which answers one JSON line; every path is the attempt's own
(rundir.py).

Started where the connection can be root, the launcher runs in a systemd unit of its own and
its exit code comes from a record only root writes (launch.py's docstring): nothing the job
prints or writes can end a follower or decide how the attempt ended.
"""

from __future__ import annotations

from typing import Any

from distrun.launchers import launcher_named
from distrun.planning.containers import stop_shell
from distrun.planning.jobplan import JobPlan
from distrun.transport import rundir
from distrun.transport.remote import node_command, root_or_person

# Seconds a follower waits for a launcher that left neither a record nor a pid file.
START_WAIT_S = 60


def _attempt(plan: JobPlan, host: str) -> dict[str, Any]:
    """The node program's config for host's launcher in the plan's attempt."""
    return {"run": plan.run_id, "run_dir": plan.run_dir, "host": host, "attempt": str(plan.attempt.restart),
            "dir": rundir.attempt_path(plan), "script": rundir.launch_script(host), "log": rundir.launcher_log(host),
            "exit_file": rundir.exit_code(host), "pid_file": rundir.launcher_pid(host), "user": plan.launch.user,
            "start_wait_s": START_WAIT_S}


def launch_command(plan: JobPlan, host: str) -> str:
    """Start host's launch script detached, in a unit (with the run's resource limits) where the
    connection can be root."""
    cfg: dict[str, Any] = {**_attempt(plan, host), "limits": [list(pair) for pair in plan.launch.unit_limits]}
    gpus = _fenced_gpus(plan, host)
    if gpus is not None:
        cfg["gpu_ids"] = list(gpus)
    return node_command(plan.launch.user, "launch", cfg, "launch", people=plan.launch.people)


def _fenced_gpus(plan: JobPlan, host: str) -> tuple[int, ...] | None:
    """The GPUs host's unit keeps (the node's other GPUs are hidden from it:
    roles/job/files/launch.py; none with --gpus 0), or None where nothing is hidden: a host
    without ranks, one where the plan maps no GPU (the node declares none), or a launcher whose
    scheduler picks the GPUs (its job runs outside this unit)."""
    placed = next((h for h in plan.placement.hosts if h.name == host), None)
    if placed is None or not placed.visible or launcher_named(plan.launch.launcher).picks_gpus:
        return None
    return placed.gpu_ids


def tail_command(plan: JobPlan, host: str) -> str:
    """The head's session: the launcher's log as it grows, then how the launcher ended. Root with
    the training user's filesystem identity where the connection can be root: no process of that
    user's, which a job could trace and make say anything, speaks for the run."""
    cfg = _attempt(plan, host)
    return node_command(plan.launch.user, "follow", cfg, "attempt", people=plan.launch.people)


def wait_command(plan: JobPlan, host: str) -> str:
    """Another launch host's session (torchrun): how its launcher ended, once it has."""
    cfg = {**_attempt(plan, host), "log": ""}
    return node_command(plan.launch.user, "follow", cfg, "attempt", people=plan.launch.people)


STOP_GRACE_S = 8  # TERM, then KILL to what outlives it: within run_each's 15 s for the stop


def stop_command(plan: JobPlan) -> str:
    """End the run on the node it reaches: its units, then every process of the training user
    the node program finds to be the run's by evidence the job cannot point at another run's
    (never a pid file the job could have rewritten); then, for a run with an image, its
    containers, in a unit of the training user's own (planning/containers.in_user_unit)."""
    stop = node_command(plan.launch.user, "stop", {"run": plan.run_id, "run_dir": plan.run_dir, "grace_s": STOP_GRACE_S,
                                                   "user": plan.launch.user}, people=plan.launch.people)
    containers = stop_shell(plan)
    return f"( {stop} ); {root_or_person(plan.launch.user, containers, people=plan.launch.people)}" if containers else stop
