"""The files a run renders for its run directory, from its plan: each launch host's launch script,
the rank wrapper every rank starts through, env.sh with the user's --env, the hostfile and the
launcher's own files; and which names there are distrun's or a launcher's."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from distrun.launchers import LAUNCHERS, launcher_named
from distrun.planning import gpus
from distrun.planning.envnames import check_env_key
from distrun.planning.jobplan import JobPlan
from distrun.planning.plan import render_hostfile
from distrun.transport import rundir


def clashes_with_run_dir(name: str) -> bool:
    """Whether a file of this name in a run directory would collide with one distrun or a launcher writes."""
    return rundir.clashes(name) or any(launcher.owns_run_dir_file(name) for launcher in LAUNCHERS.values())


def _comment(text: str) -> str:
    """Text for one comment line of a script: a newline would start a command."""
    return " ".join(str(text).split())


def launch_scripts(plan: JobPlan) -> dict[str, str]:
    """Host name -> the launch script that host runs (the launcher says which hosts start it).

    Files carry the host's name: on a shared folder every node writes into the same run dir.
    Each script lives in its attempt's folder and writes only there (rundir.py).
    """
    launcher = launcher_named(plan.launch.launcher)
    scripts: dict[str, str] = {}
    for host in launcher.started_hosts(plan):
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
            + shlex.join(launcher.started_command(plan, host)) + f" > {log} 2>&1 < /dev/null\n"
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
                           for h in plan.placement.hosts if h.address and h.address != h.name)
    by_name = "\n".join(f"  {shlex.quote(h.name)}) DISTRUN_HOST={shlex.quote(h.name)} ;;" for h in plan.placement.hosts)
    ifaces = "\n".join(f"  {shlex.quote(h.name)}) IFACE={shlex.quote(h.iface)} ;;" for h in plan.placement.hosts if h.iface)
    # The ranks this node runs, as placed: mpirun and srun do not say so in torch's words.
    local = "\n".join(f"  {shlex.quote(h.name)}) DISTRUN_LOCAL_SIZE={int(h.slots)} ;;" for h in plan.placement.hosts)
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


def _gpu_block(plan: JobPlan) -> str:
    """Shell that gives each rank of a node the GPUs the plan maps to it (planning/gpus.py), by its
    node and LOCAL_RANK; "" where the plan maps none. Inside one container per node (the wrapper
    runs in it) the indices are the container's own."""
    launcher = launcher_named(plan.launch.launcher)
    renumber = plan.launch.container is not None and not launcher.container_per_rank
    arms = []
    for h in plan.placement.hosts:
        by_value: dict[str, list[str]] = {}
        for local_rank, value in enumerate(h.visible):
            shown = gpus.in_container(value, h.gpu_ids) if renumber else value
            by_value.setdefault(shown, []).append(shlex.quote(f"{h.name}:{local_rank}"))
        arms += [f"  {'|'.join(keys)}) export CUDA_VISIBLE_DEVICES={shlex.quote(value)} "
                 f"{'='.join(gpus.ORDER)} ;;" for value, keys in by_value.items()]
    if not arms:
        return ""
    return 'case "$DISTRUN_HOST:$LOCAL_RANK" in\n' + "\n".join(arms) + "\nesac\n"


def _rank_variable(plan: JobPlan, name: str, default: str) -> str:
    """``export NAME=...``: its own value, else the first of the launcher's variables it is
    declared from (``Launcher.rank_variables``) that is set, else ``default``."""
    value = default
    for source in reversed(launcher_named(plan.launch.launcher).rank_variables.get(name, ())):
        value = f"${{{source}:-{value}}}"
    return f'export {name}="${{{name}:-{value}}}"'


def _restart_count(plan: JobPlan, started: str) -> str:
    """DISTRUN_RESTART counts the launcher's restarts in place too (Launcher.restarts_in_place):
    one line per start of this local rank on this node, in the attempt's ``started`` folder.
    Every agent restarts all of its ranks at each new rendezvous, whichever node failed, so the
    count is the same on every rank of the group. torchrun's TORCHELASTIC_RESTART_COUNT is not:
    an agent counts only the restarts it made for its own failed workers, so the ranks of the
    other nodes would start again with 0 and a job would resume on some nodes only."""
    if not launcher_named(plan.launch.launcher).restarts_in_place:
        return ""
    # The folder is the rank marker's, made just before (render_rank_wrapper): none, no count.
    return (f'starts={started}/"{rundir.STARTS_PREFIX}${{DISTRUN_HOST//[^A-Za-z0-9._-]/_}}-${{LOCAL_RANK//[^0-9]/}}"\n'
            f'n="$({{ echo $$ >> "$starts" && wc -l < "$starts"; }} 2>/dev/null)" || n=\n'
            'n="${n//[^0-9]/}"\n'
            f'if [ -n "$n" ] && [ "$n" -gt 0 ]; then export DISTRUN_RESTART="$(( {int(plan.attempt.restart)} + 10#$n - 1 ))"; fi\n')


def render_rank_wrapper(plan: JobPlan) -> str:
    """Every rank starts through this script, whichever launcher placed it.

    It maps the launcher's variables to the RANK/WORLD_SIZE/LOCAL_RANK that torch and user
    scripts read, sets the node's own interface for NCCL/Gloo (names can differ per node), and
    prints one header line so per-rank logs can be matched to ranks afterwards.
    """
    iface_block = _host_block(plan)
    if plan.placement.cidr:
        iface_block += (
            'if [ -z "$IFACE" ]; then\n'
            f"  IFACE=\"$(ip -o -4 addr show to {shlex.quote(plan.placement.cidr)} 2>/dev/null | awk '{{print $2; exit}}')\"\n"
            "fi\n"
        )
    source_env = f". ./{rundir.ENV_FILE}\n" if plan.program.user_env_keys else ""
    if plan.program.workdir:
        # A project's command names its tools as on a workstation ("python", "torchrun"): the
        # env's bin comes first on PATH, and the rank starts in the project folder.
        source_env += (f"export PATH={shlex.quote(plan.launch.env_prefix.rstrip('/') + '/bin')}:\"$PATH\"\n"
                       f"cd {shlex.quote(plan.program.workdir)}\n")
    started = shlex.quote(rundir.in_attempt(plan, rundir.STARTED))
    gpu_block = _gpu_block(plan)
    # Each rank's log starts with its place (and the GPUs it was given): collected logs are read by it.
    header = ("DISTRUN_RANK rank=$RANK local_rank=$LOCAL_RANK world_size=$WORLD_SIZE host=$DISTRUN_HOST "
              "machine=$(hostname -s) pid=$$" + (" cuda_visible_devices=${CUDA_VISIBLE_DEVICES-unset}" if gpu_block else ""))
    return f"""#!/bin/bash
# Rank wrapper for distrun run {" ".join(plan.run_id.split())}. Generated; do not edit.
set -euo pipefail
{_rank_variable(plan, "RANK", "0")}
{_rank_variable(plan, "WORLD_SIZE", "1")}
{_rank_variable(plan, "LOCAL_RANK", "0")}
if [ -z "${{MASTER_ADDR:-}}" ]; then MASTER_ADDR={shlex.quote(str(plan.placement.master_addr))}; fi
export MASTER_ADDR
export MASTER_PORT="${{MASTER_PORT:-{int(plan.placement.master_port)}}}"
{iface_block}if [ -z "$IFACE" ]; then
  # No planned interface (a Slurm distrun does not administer): Gloo and NCCL would find this
  # node by its hostname, which Debian's installer puts on 127.0.1.1, where no other node can
  # reach it. Then the interface of the default route stands in.
  case "$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {{print $1}}')" in
    127.*|"") IFACE="$(ip -o -4 route show default 2>/dev/null \\
                      | awk '{{for (i = 1; i < NF; i++) if ($i == "dev") {{print $(i + 1); exit}}}}')" ;;
  esac
fi
{_rank_variable(plan, "LOCAL_WORLD_SIZE", "$DISTRUN_LOCAL_SIZE")}
if [ -n "$IFACE" ]; then
  export GLOO_SOCKET_IFNAME="${{GLOO_SOCKET_IFNAME:-$IFACE}}"
  export NCCL_SOCKET_IFNAME="${{NCCL_SOCKET_IFNAME:-$IFACE}}"
fi
{gpu_block}echo "{header}"
cd {shlex.quote(plan.run_dir)}
# One marker per started rank: 'distrun train --detach' and 'distrun status' count them.
{{ mkdir -p {started} && echo "$(hostname -s) $$" > {started}/"rank-$RANK"; }} 2>/dev/null || :
{_restart_count(plan, started)}{source_env}exec "$@"
"""


def plan_files(plan: JobPlan) -> dict[str, str]:
    """Run-directory file name -> content: the hostfile, the rank wrapper and the launcher's own.
    A site's Slurm (plan.placement.login) places the ranks itself: no hostfile there."""
    hostfile = {} if plan.placement.login else {rundir.HOSTFILE: render_hostfile(plan)}
    return {**hostfile, rundir.WRAPPER: render_rank_wrapper(plan), **launcher_named(plan.launch.launcher).files(plan)}
