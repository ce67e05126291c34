"""A user's project made ready before its run: the workdir sent to the head (with a warning
when it is large), the ``--prepare`` step run there with its output streamed, and the record of
both in the run record (``workdir.json``, ``prepare.log``). In sync mode the other rank hosts
pull the head's copy during the run's stage step, after the prepare step, so what it wrote
reaches them too; their rsync reports join ``workdir.json`` afterwards.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster
from distrun.planning.jobplan import JobPlan
from distrun.project.prepare import prepare_argv, run_prepare
from distrun.project.workdir import Scan, SyncStats, node_path, parse_stats, pull_argv, push, push_argv, read_rules, rsync_filters
from distrun.store.runs import Run
from distrun.transport import rundir
from distrun.transport.playbook_events import PlaybookResult

# The fact the stage step publishes on each rank host with its rsync's report (roles/job).
PULL_FACT = "job_workdir_pull_report"


@dataclass(frozen=True)
class Project:
    local: Path
    node_path: str
    filters: list[str]
    scan: Scan


def load_project(local: Path, shared_dir: str) -> Project:
    if not local.is_dir():
        raise UserError(f"--workdir {local}: no such folder; pass your project's folder")
    rules, scan = read_rules(local)
    return Project(local.resolve(), node_path(shared_dir, local), rsync_filters(rules), scan)


def pull_hosts(cluster: Cluster, plan: JobPlan) -> list[str]:
    """Rank hosts that keep their own copy and pull it from the head: sync mode only."""
    if cluster.shared_fs_mode != "sync":
        return []
    return [h for h in plan.placement.reached_hosts if h != cluster.head.name]


def pull_command(cluster: Cluster, plan: JobPlan, project: Project) -> list[str]:
    return (pull_argv(cluster.head.name, project.node_path, project.filters, rundir.mesh_key(plan))
            if pull_hosts(cluster, plan) else [])


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def large_warning(project: Project) -> str | None:
    s = project.scan
    if not s.large:
        return None
    return (f"--workdir {project.local}: {size_text(s.bytes)} in {s.files} files go to the cluster (after "
            f"{', '.join(s.ignore_files) or 'no .gitignore/.distrunignore'}); the first run sends them all, later runs "
            "only what changed. Put data and outputs in .distrunignore and read data from a path every node has")


def commands(cluster: Cluster, plan: JobPlan, project: Project) -> dict[str, str]:
    """What runs before the launch, for commands.txt and --dry-run: title -> command."""
    out = {f"workdir sync: {project.local} -> {cluster.head.name}:{project.node_path} (on the controller)":
           shlex.join(push_argv(cluster.head, plan.launch.user, project.local, project.node_path, project.filters))}
    pull = pull_command(cluster, plan, project)
    if pull:
        out[f"workdir pull from the head (on {', '.join(pull_hosts(cluster, plan))}, in the stage step)"] = shlex.join(pull)
    if plan.program.prepare:
        out[f"prepare (on {cluster.head.name} as {plan.launch.user}, in {project.node_path})"] = shlex.join(
            prepare_argv(cluster.head, plan))
    return out


class ProjectListener(Protocol):
    """What making a project ready reports (train.Listener implements it)."""

    def warn(self, message: str) -> None: ...

    def workdir_synced(self, host: str, scan: Scan, stats: SyncStats) -> None: ...

    def prepare_started(self, host: str, argv: tuple[str, ...]) -> None: ...

    def prepare_line(self, text: str) -> None: ...


def make_ready(cluster: Cluster, plan: JobPlan, project: Project, env_text: str, run: Run,
               listener: ProjectListener) -> None:
    """Send the workdir to the head and run --prepare there; refuse the run (UserError) when either fails."""
    warning = large_warning(project)
    if warning:
        listener.warn(warning)
    head = cluster.head
    stats = push(head, plan.launch.user, project.local, project.node_path, project.filters)
    listener.workdir_synced(head.name, project.scan, stats)
    record = {"local": str(project.local), "node_path": project.node_path, "files": project.scan.files,
              "bytes": project.scan.bytes, "ignore_files": list(project.scan.ignore_files),
              "push": {"host": head.name, **stats.as_dict()}, "pulls": {}}
    run.write("workdir.json", json.dumps(record, indent=2) + "\n")
    if not plan.program.prepare:
        return
    listener.prepare_started(head.name, plan.program.prepare)
    with (run.dir / "prepare.log").open("w") as log:

        def on_line(text: str) -> None:
            log.write(text + "\n")
            log.flush()
            listener.prepare_line(text)

        rc = run_prepare(head, plan, env_text, on_line)
    if rc != 0:
        why = f"lost contact with {head.name} (ssh failed)" if rc == 255 and head.connection != "local" else f"exited {rc}"
        raise UserError(f"--prepare {shlex.join(plan.program.prepare)} {why} on {head.name}: nothing was launched "
                        f"(its output: {run.dir / 'prepare.log'})", exit_code=ExitCode.STAGING)


def record_pulls(run: Run, result: PlaybookResult) -> dict[str, dict[str, Any]]:
    """Each rank host's rsync report from the stage step, added to workdir.json."""
    path = run.dir / "workdir.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    for name, host in sorted(result.hosts.items()):
        text = host.facts.get(PULL_FACT)
        if isinstance(text, str):
            record["pulls"][name] = parse_stats(text).as_dict()
    run.write("workdir.json", json.dumps(record, indent=2) + "\n")
    return dict(record["pulls"])


def check_flags(workdir: Path | None, script: Path | None, prepare: str | None, command: tuple[str, ...]) -> None:
    """The train options of a project run, as the command line gave them: one line for a bad mix."""
    if workdir is None:
        if prepare:
            raise UserError("--prepare runs in your project folder: pass it with --workdir DIR")
        return
    if script is not None:
        raise UserError(f"--script and --workdir: give one; with --workdir put the command after --: "
                        f"--workdir {workdir} -- python {script.name}")
    if not workdir.is_dir():
        raise UserError(f"--workdir {workdir}: no such folder; pass your project's folder")
    if not command:
        raise UserError(f"--workdir {workdir} needs the command every rank runs, after --: "
                        f"distrun train -i NAME --workdir {workdir} -- python train.py")
