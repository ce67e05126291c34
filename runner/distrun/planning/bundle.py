"""What a run sends to its nodes and tells the roles: the bundle that carries its rendered files
(run_files) and program, the record of exactly what runs, and the extra-vars of run.yml and
stage.yml (the contract with the job and preflight roles)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shlex
import tarfile
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.launchers import launcher_named
from distrun.launchers.base import fill
from distrun.planning.jobplan import JobPlan, to_json
from distrun.planning.needs import preflight_needs
from distrun.planning.network import NetworkChoice
from distrun.planning.plan import WORKLOADS
from distrun.planning.run_files import launch_files, render_env_file
from distrun.store.runs import Run
from distrun.transport import rundir


def run_bundle(run: Run, files: dict[str, str], script: Path | None, with_workloads: bool = True,
               private: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Pack what a run needs on its nodes into one archive, sent in one round trip per host.

    ``run/`` holds the rendered files and launch scripts (exact text, 0644; scripts 0755) and
    the user's program; ``workloads/`` the reference workloads, whose digest names a marker on
    the nodes so unchanged workloads are not unpacked again; ``private`` files (the attempt's ssh
    key and certificate) are 0600. The archive is stored base64 in the run record (0600; it travels
    on the upload's stdin). Returns (bundle path, workloads digest).
    """
    src = paths.project_dir() / "workloads"
    wl_files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if with_workloads else []
    digest = hashlib.sha256()
    for f in wl_files:
        digest.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes() + b"\0")

    def add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            add(tar, f"run/{name}", text.encode(), 0o755 if name.endswith(".sh") else 0o644)
        for name, text in sorted((private or {}).items()):
            add(tar, f"run/{name}", text.encode(), 0o600)
        if script is not None:
            add(tar, f"run/{script.name}", script.read_bytes(), 0o644)
        for f in wl_files:
            add(tar, f"workloads/{f.relative_to(src)}", f.read_bytes(), 0o644)
    path = run.write("bundle.tar.gz.b64", base64.b64encode(buf.getvalue()).decode() + "\n")
    return str(path), digest.hexdigest()[:16]


def needs_jittor(plan: JobPlan) -> bool:
    return plan.program.workload is not None and WORKLOADS[plan.program.workload].framework == "jittor"


def common_vars(plan: JobPlan) -> dict[str, Any]:
    """What every step of a run (stage, launch, stop, collect) is told about it."""
    return {
        "distrun_run_id": plan.run_id,
        "distrun_run_dir": plan.run_dir,
        "distrun_rank_hosts": list(plan.placement.reached_hosts),
    }


def stage_vars(plan: JobPlan, run: Run, files: dict[str, str], scripts: dict[str, str],
               script: Path | None, jittor_warm: bool, env: dict[str, str] | None = None,
               workdir_pull: list[str] | None = None, private: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Extravars of run.yml and stage.yml.

    ``env`` (the user's --env) goes in its own 0600 file, never in the bundle, the plan or an
    extravar: ansible-runner records extravars, and the bundle is a logged task's stdin.
    """
    bundle, digest = run_bundle(run, {**files, **launch_files(plan, scripts)}, script.resolve() if script else None,
                                private=private)
    env_file = str(run.write(rundir.ENV_FILE, render_env_file(env), mode=0o600)) if env else ""
    return {
        "distrun_env_file": env_file,
        **common_vars(plan),
        "distrun_run_bundle": bundle,
        "distrun_workloads_digest": digest,
        "distrun_jittor_warm": jittor_warm,
        "distrun_partition_argv": list(plan.program.partition or []),
        "distrun_partition_dir": plan.program.partition_dir or "",
        # Sync mode: a node pulls only the parts its own ranks read (part p is rank p's), where
        # the launcher's rank order is known before launch; elsewhere every node pulls every part.
        "distrun_partition_parts": partition_parts(plan),
        # Sync mode: each rank host's rsync of the head's copy of the workdir (workdir.pull_argv).
        "distrun_workdir_pull_argv": list(workdir_pull or []),
        # The attempt's ssh key (its certificate beside it), with which the stage step's copies log in.
        "distrun_mesh_key": rundir.mesh_key(plan) if private else "",
    }


def partition_parts(plan: JobPlan) -> dict[str, list[int]]:
    """Host -> the parts its ranks read; {} without a partition or where the launcher's scheduler
    orders the ranks once the job starts."""
    hosts = [asdict(h) for h in plan.placement.hosts]
    order = launcher_named(plan.launch.launcher).rank_order(hosts) if plan.program.partition_dir else None
    return fill(order) if order is not None else {}


def planned_network(plan: JobPlan, network: NetworkChoice | None) -> dict[str, dict[str, str]]:
    """What run.yml verifies before staging: each rank host's interface still has its address."""
    if network is None:
        return {}
    rank_hosts = set(plan.placement.reached_hosts)
    return {h: {"iface": c.name, "address": c.address} for h, c in network.per_host.items() if h in rank_hosts}


def run_vars(plan: JobPlan, run: Run, files: dict[str, str], scripts: dict[str, str], *, script: Path | None,
             env: dict[str, str], network: NetworkChoice | None, preflight: bool,
             workdir_pull: list[str] | None = None, private: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Extravars of run.yml: the stage step's, what this run needs and the network to verify."""
    return {
        **stage_vars(plan, run, files, scripts, script, needs_jittor(plan), env, workdir_pull, private),
        "distrun_planned_network": planned_network(plan, network),
        "distrun_skip_preflight": not preflight,
        "distrun_checkpoint_dir": plan.checkpoint_dir,
        # A restart resumes from the head's checkpoints: in sync mode every node pulls them first.
        "distrun_pull_checkpoints": plan.attempt.restart > 0,
        **preflight_needs(plan),
    }


def needs_stage_steps(extravars: Mapping[str, Any], shared_fs_mode: str) -> bool:
    """Whether any node of a run has a step of role job's stage_steps.yml to do (partitioning on
    the head, pulling parts, checkpoints or the workdir from it in sync mode, compiling Jittor).
    Each step there also says for itself which nodes it applies to; a run that needs none of them
    skips the file by its tag (job_stage_steps) and pays for no task at all."""
    pulls = (bool(extravars.get("distrun_partition_dir"))
             or bool(extravars.get("distrun_pull_checkpoints") and extravars.get("distrun_checkpoint_dir"))
             or bool(extravars.get("distrun_workdir_pull_argv")))
    return (bool(extravars.get("distrun_partition_argv")) or bool(extravars.get("distrun_jittor_warm"))
            or (shared_fs_mode == "sync" and pulls))




def record_plan(run: Run, plan: JobPlan, files: dict[str, str], scripts: dict[str, str],
                before: dict[str, str] | None = None) -> None:
    """plan.json, commands.txt and commands.json (the argv of the partition and of each host's
    launch): exactly what this run executes, readable before it starts. ``before``: title -> text
    of the steps that run before the launch (the workdir's sync)."""
    run.write("plan.json", json.dumps(to_json(plan), indent=2) + "\n")
    commands = [f"# {name}\n{text}" for name, text in {**files, **launch_files(plan, scripts)}.items()]
    if plan.program.partition:
        commands.insert(0, "# partition\n" + shlex.join(plan.program.partition) + "\n")
    if plan.program.prepare:
        commands.insert(0, "# prepare (on the head, in the workdir)\n" + shlex.join(plan.program.prepare) + "\n")
    commands[:0] = [f"# {title}\n{text.rstrip()}\n" for title, text in (before or {}).items()]
    run.write("commands.txt", "\n".join(commands))
    launcher = launcher_named(plan.launch.launcher)
    argv = {"partition": list(plan.program.partition) if plan.program.partition else None,
            "launch": {h.name: launcher.started_command(plan, h) for h in launcher.started_hosts(plan)}}
    run.write("commands.json", json.dumps(argv, indent=2) + "\n")
