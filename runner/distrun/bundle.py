"""What a run sends to its nodes and tells the roles: the launch scripts, the rendered files, the
bundle that carries them, the record of exactly what runs, and the extra-vars of run.yml and
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

from . import paths, rundir
from .envnames import check_env_key
from .launchers import LAUNCHERS, launcher_named
from .launchers.base import fill
from .needs import preflight_needs
from .network import NetworkChoice
from .plan import WORKLOADS, JobPlan, render_hostfile
from .runs import Run


def clashes_with_run_dir(name: str) -> bool:
    """Whether a file of this name in a run directory would collide with one distrun or a launcher writes."""
    return rundir.clashes(name) or any(name in launcher.run_dir_files for launcher in LAUNCHERS.values())


def _comment(text: str) -> str:
    """Text for one comment line of a script: a newline would start a command."""
    return " ".join(str(text).split())


def launch_scripts(plan: JobPlan) -> dict[str, str]:
    """Host name -> the launch script that host runs (the launcher says which hosts start it).

    Files carry the host's name: on a shared folder every node writes into the same run dir.
    Each script lives in its attempt's folder and writes only there (rundir.py).
    """
    launcher = launcher_named(plan.launcher)
    scripts: dict[str, str] = {}
    for host in launcher.launch_hosts(plan):
        # Host names are checked when the inventory is loaded; quoted here all the same.
        name = host.name
        pid, log = shlex.quote(rundir.launcher_pid(name)), shlex.quote(rundir.launcher_log(name))
        pgid = shlex.quote(rundir.launcher_pgid(name))
        tmp, code = shlex.quote(rundir.exit_code(name) + ".tmp"), shlex.quote(rundir.exit_code(name))
        scripts[name] = (
            "#!/bin/bash\n"
            f"# distrun run {plan.run_id}: generated launch script for {_comment(name)}\n"
            # Never anywhere else: a script that cannot enter its folder writes nothing.
            f"cd {shlex.quote(rundir.attempt_path(plan))} || exit 3\n"
            f"echo $$ > {pid}\n"
            # The launcher leads its own process group (started with setsid): 'distrun stop'
            # stops that group too, even a process that dropped DISTRUN_RUN_ID from its environment.
            f"read -r _ _ _ _ pgid _ < /proc/$$/stat && echo \"$pgid\" > {pgid}\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in launcher.environment(plan, host))
            + shlex.join(launcher.command(plan, host)) + f" > {log} 2>&1 < /dev/null\n"
            "rc=$?\n"
            f"echo $rc > {tmp} && mv {tmp} {code}\n"
            "exit $rc\n"
        )
    return scripts


def launch_files(plan: JobPlan, scripts: dict[str, str]) -> dict[str, str]:
    """The launch scripts by their path in the run directory (in the attempt's folder)."""
    return {rundir.in_attempt(plan, rundir.launch_script(h)): text for h, text in scripts.items()}


def render_env_file(env: Mapping[str, str]) -> str:
    """env.sh: the user's --env variables, sourced by the rank wrapper. Staged 0600, owned by
    the training user, so no other local user reads the values (launch scripts and argv are
    world-readable)."""
    for key in env:
        check_env_key(key)
    return "# distrun --env variables. Generated; do not edit.\n" + "".join(
        f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items())
    )


def _host_block(plan: JobPlan) -> str:
    """Shell that sets DISTRUN_HOST (this node's inventory name) and IFACE (its planned interface).

    An inventory's names need not be the machines' hostnames (``alpha ansible_host=10.0.0.11``
    on a machine called node1): a node is found by its inventory address among its own addresses
    first, then by its hostname; a node found neither way is named by its hostname.
    """
    by_address = "\n".join(f"  *{shlex.quote(f' {h.address} ')}*) DISTRUN_HOST={shlex.quote(h.name)} ;;"
                           for h in plan.hosts if h.address and h.address != h.name)
    by_name = "\n".join(f"  {shlex.quote(h.name)}) DISTRUN_HOST={shlex.quote(h.name)} ;;" for h in plan.hosts)
    ifaces = "\n".join(f"  {shlex.quote(h.name)}) IFACE={shlex.quote(h.iface)} ;;" for h in plan.hosts if h.iface)
    # The ranks this node runs, as placed: mpirun and srun do not say so in torch's words.
    local = "\n".join(f"  {shlex.quote(h.name)}) DISTRUN_LOCAL_SIZE={int(h.slots)} ;;" for h in plan.hosts)
    block = "DISTRUN_HOST=\n"
    if by_address:
        block += f'case " $(hostname -I 2>/dev/null || true) " in\n{by_address}\nesac\n'
    block += ('if [ -z "$DISTRUN_HOST" ]; then\n  case "$(hostname -s)" in\n'
              + "".join(f"  {line}\n" for line in by_name.splitlines())
              + '    *) DISTRUN_HOST="$(hostname -s)" ;;\n  esac\nfi\nexport DISTRUN_HOST\nIFACE=\n')
    if ifaces:
        block += f'case "$DISTRUN_HOST" in\n{ifaces}\nesac\n'
    block += f'DISTRUN_LOCAL_SIZE=1\ncase "$DISTRUN_HOST" in\n{local}\nesac\n'
    return block


def render_rank_wrapper(plan: JobPlan) -> str:
    """Every rank starts through this script, whichever launcher placed it.

    It maps the launcher's variables to the RANK/WORLD_SIZE/LOCAL_RANK that torch and user
    scripts read, sets the node's own interface for NCCL/Gloo (names can differ per node), and
    prints one header line so per-rank logs can be matched to ranks afterwards.
    """
    iface_block = _host_block(plan)
    if plan.cidr:
        iface_block += (
            'if [ -z "$IFACE" ]; then\n'
            f"  IFACE=\"$(ip -o -4 addr show to {shlex.quote(plan.cidr)} 2>/dev/null | awk '{{print $2; exit}}')\"\n"
            "fi\n"
        )
    source_env = ". ./env.sh\n" if plan.user_env_keys else ""
    if plan.workdir:
        # A project's command names its tools as on a workstation ("python", "torchrun"): the
        # env's bin comes first on PATH, and the rank starts in the project folder.
        source_env += (f"export PATH={shlex.quote(plan.env_prefix.rstrip('/') + '/bin')}:\"$PATH\"\n"
                       f"cd {shlex.quote(plan.workdir)}\n")
    started = shlex.quote(rundir.in_attempt(plan, rundir.STARTED))
    return f"""#!/bin/bash
# Rank wrapper for distrun run {" ".join(plan.run_id.split())}. Generated; do not edit.
set -euo pipefail
export RANK="${{RANK:-${{OMPI_COMM_WORLD_RANK:-${{PMI_RANK:-${{SLURM_PROCID:-0}}}}}}}}"
export WORLD_SIZE="${{WORLD_SIZE:-${{OMPI_COMM_WORLD_SIZE:-${{PMI_SIZE:-${{SLURM_NTASKS:-1}}}}}}}}"
export LOCAL_RANK="${{LOCAL_RANK:-${{OMPI_COMM_WORLD_LOCAL_RANK:-${{SLURM_LOCALID:-0}}}}}}"
if [ -z "${{MASTER_ADDR:-}}" ]; then MASTER_ADDR={shlex.quote(str(plan.master_addr))}; fi
export MASTER_ADDR
export MASTER_PORT="${{MASTER_PORT:-{int(plan.master_port)}}}"
{iface_block}if [ -z "$IFACE" ]; then
  # No planned interface (a Slurm distrun does not administer): Gloo and NCCL would find this
  # node by its hostname, which Debian's installer puts on 127.0.1.1, where no other node can
  # reach it. Then the interface of the default route stands in.
  case "$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {{print $1}}')" in
    127.*|"") IFACE="$(ip -o -4 route show default 2>/dev/null \\
                      | awk '{{for (i = 1; i < NF; i++) if ($i == "dev") {{print $(i + 1); exit}}}}')" ;;
  esac
fi
export LOCAL_WORLD_SIZE="${{LOCAL_WORLD_SIZE:-${{OMPI_COMM_WORLD_LOCAL_SIZE:-$DISTRUN_LOCAL_SIZE}}}}"
if [ -n "$IFACE" ]; then
  export GLOO_SOCKET_IFNAME="${{GLOO_SOCKET_IFNAME:-$IFACE}}"
  export NCCL_SOCKET_IFNAME="${{NCCL_SOCKET_IFNAME:-$IFACE}}"
fi
echo "DISTRUN_RANK rank=$RANK local_rank=$LOCAL_RANK world_size=$WORLD_SIZE host=$DISTRUN_HOST machine=$(hostname -s) pid=$$"
cd {shlex.quote(plan.run_dir)}
# One marker per started rank: 'distrun train --detach' and 'distrun status' count them.
{{ mkdir -p {started} && echo "$(hostname -s) $$" > {started}/"rank-$RANK"; }} 2>/dev/null || :
{source_env}exec "$@"
"""


def plan_files(plan: JobPlan) -> dict[str, str]:
    """Run-directory file name -> content: the hostfile, the rank wrapper and the launcher's own.
    A site's Slurm (plan.login) places the ranks itself: no hostfile there."""
    hostfile = {} if plan.login else {"hostfile": render_hostfile(plan)}
    return {**hostfile, "rank-env.sh": render_rank_wrapper(plan), **launcher_named(plan.launcher).files(plan)}


def run_bundle(run: Run, files: dict[str, str], script: Path | None, with_workloads: bool = True) -> tuple[str, str]:
    """Pack what a run needs on its nodes into one archive, sent in one round trip per host.

    ``run/`` holds the rendered files and launch scripts (exact text, 0644; scripts 0755) and
    the user's program; ``workloads/`` the reference workloads, whose digest names a marker on
    the nodes so unchanged workloads are not unpacked again. The archive is stored base64 in
    the run record (it travels as a task's stdin). Returns (bundle path, workloads digest).
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
        if script is not None:
            add(tar, f"run/{script.name}", script.read_bytes(), 0o644)
        for f in wl_files:
            add(tar, f"workloads/{f.relative_to(src)}", f.read_bytes(), 0o644)
    path = run.write("bundle.tar.gz.b64", base64.b64encode(buf.getvalue()).decode() + "\n")
    return str(path), digest.hexdigest()[:16]


def needs_jittor(plan: JobPlan) -> bool:
    return plan.workload is not None and WORKLOADS[plan.workload].framework == "jittor"


def common_vars(plan: JobPlan) -> dict[str, Any]:
    """What every step of a run (stage, launch, stop, collect) is told about it."""
    return {
        "distrun_run_id": plan.run_id,
        "distrun_run_dir": plan.run_dir,
        "distrun_rank_hosts": list(plan.reached_hosts),
    }


def stage_vars(plan: JobPlan, run: Run, files: dict[str, str], scripts: dict[str, str],
               script: Path | None, jittor_warm: bool, env: dict[str, str] | None = None,
               workdir_pull: list[str] | None = None) -> dict[str, Any]:
    """Extravars of run.yml and stage.yml.

    ``env`` (the user's --env) goes in its own 0600 file, never in the bundle, the plan or an
    extravar: ansible-runner records extravars, and the bundle is a logged task's stdin.
    """
    bundle, digest = run_bundle(run, {**files, **launch_files(plan, scripts)}, script.resolve() if script else None)
    env_file = str(run.write("env.sh", render_env_file(env), mode=0o600)) if env else ""
    return {
        "distrun_env_file": env_file,
        **common_vars(plan),
        "distrun_run_bundle": bundle,
        "distrun_workloads_digest": digest,
        "distrun_jittor_warm": jittor_warm,
        "distrun_partition_argv": list(plan.partition or []),
        "distrun_partition_dir": plan.partition_dir or "",
        # Sync mode: a node pulls only the parts its own ranks read (part p is rank p's), where
        # the launcher's rank order is known before launch; elsewhere every node pulls every part.
        "distrun_partition_parts": partition_parts(plan),
        # Sync mode: each rank host's rsync of the head's copy of the workdir (workdir.pull_argv).
        "distrun_workdir_pull_argv": list(workdir_pull or []),
    }


def partition_parts(plan: JobPlan) -> dict[str, list[int]]:
    """Host -> the parts its ranks read; {} without a partition or where the launcher's scheduler
    orders the ranks once the job starts."""
    order = launcher_named(plan.launcher).rank_order([asdict(h) for h in plan.hosts]) if plan.partition_dir else None
    return fill(order) if order is not None else {}


def planned_network(plan: JobPlan, network: NetworkChoice | None) -> dict[str, dict[str, str]]:
    """What run.yml verifies before staging: each rank host's interface still has its address."""
    if network is None:
        return {}
    rank_hosts = set(plan.reached_hosts)
    return {h: {"iface": c.name, "address": c.address} for h, c in network.per_host.items() if h in rank_hosts}


def run_vars(plan: JobPlan, run: Run, files: dict[str, str], scripts: dict[str, str], *, script: Path | None,
             env: dict[str, str], network: NetworkChoice | None, preflight: bool,
             workdir_pull: list[str] | None = None) -> dict[str, Any]:
    """Extravars of run.yml: the stage step's, what this run needs and the network to verify."""
    return {
        **stage_vars(plan, run, files, scripts, script, needs_jittor(plan), env, workdir_pull),
        "distrun_planned_network": planned_network(plan, network),
        "distrun_skip_preflight": not preflight,
        "distrun_checkpoint_dir": plan.checkpoint_dir,
        # A restart resumes from the head's checkpoints: in sync mode every node pulls them first.
        "distrun_pull_checkpoints": plan.restart > 0,
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
    run.write("plan.json", json.dumps(asdict(plan), indent=2, default=str) + "\n")
    commands = [f"# {name}\n{text}" for name, text in {**files, **launch_files(plan, scripts)}.items()]
    if plan.partition:
        commands.insert(0, "# partition\n" + shlex.join(plan.partition) + "\n")
    if plan.prepare:
        commands.insert(0, "# prepare (on the head, in the workdir)\n" + shlex.join(plan.prepare) + "\n")
    commands[:0] = [f"# {title}\n{text.rstrip()}\n" for title, text in (before or {}).items()]
    run.write("commands.txt", "\n".join(commands))
    launcher = launcher_named(plan.launcher)
    argv = {"partition": list(plan.partition) if plan.partition else None,
            "launch": {h.name: launcher.command(plan, h) for h in launcher.launch_hosts(plan)}}
    run.write("commands.json", json.dumps(argv, indent=2) + "\n")
