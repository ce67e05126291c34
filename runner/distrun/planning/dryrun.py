"""The dry run: everything a run would do (the plan and every file and command it would run, the
launcher's options and where each value came from), touching no node."""

from __future__ import annotations

from dataclasses import dataclass, field

from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.launchers.options import Resolved, resolve
from distrun.planning.attempt import plan_attempt
from distrun.planning.jobplan import JobPlan
from distrun.planning.request import JobRequest, load_noting
from distrun.planning.run_files import launch_scripts, plan_files
from distrun.project.ready import Project, commands, load_project


@dataclass(frozen=True)
class DryRun:
    """Everything a run would do, for --dry-run to show."""

    cluster: Cluster
    plan: JobPlan
    files: dict[str, str]  # run-directory file -> its text
    scripts: dict[str, str]  # host -> its launch script
    note: str | None  # why a real run would be refused, if it would
    project: Project | None = None  # --workdir: the folder and what a sync would send
    before: dict[str, str] = field(default_factory=dict)  # title -> command run before the launch
    options: dict[str, Resolved] = field(default_factory=dict)  # the launcher's options and their origins
    left_out: list[str] = field(default_factory=list)  # a line per drained worker the run leaves out


def dry_run(request: JobRequest) -> DryRun:
    cluster, left_out = load_noting(request)
    plan = plan_attempt(request, cluster, "DRYRUN").plan
    workdir = request.program.workdir
    project = load_project(workdir, cluster.shared_dir) if workdir else None
    launcher = launcher_named(plan.launch.launcher)
    return DryRun(cluster, plan, plan_files(plan), launch_scripts(plan), launcher.unready(cluster),
                  project, commands(cluster, plan, project) if project else {},
                  resolve(launcher, request.launch.options, cluster.group_vars, cluster.source), left_out)
