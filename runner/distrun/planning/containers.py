"""Ranks inside a container image: which image and runtime a run uses, the script that starts
a container on a node, Slurm's pyxis options, the removal of a run's containers, and the unit of
the user's own that the runtime runs in outside a run (``in_user_unit``).

Every container of a run shares the node's network, IPC namespace and (for ranks that mpirun
starts one container each) its process namespace; it runs as the training user, sees the shared
folder, the run directory and the workdir at their own paths, and gets its variables by name
only (``--env NAME``): values stay in the environment, never in argv. Pure functions of the plan.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.errors import PlanError
from distrun.planning import gpus
from distrun.transport import rundir

if TYPE_CHECKING:
    from distrun.planning.jobplan import JobPlan

RUNTIMES = ("podman", "docker")
DEFAULT_RUNTIME = "podman"
SCRIPT = rundir.CONTAINER_SCRIPT  # in the run directory, beside the rank wrapper
RECORD = "image.json"  # in the run's record: the image every node's probe found
LABEL = "distrun.run"

# An OCI image reference: [registry[:port]/]path[:tag][@digest] (the distribution spec's grammar,
# lower-case path components); never an option, never shell text.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)"
_IMAGE = re.compile(rf"{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                    r"(?:@sha256:[a-f0-9]{64})?")

# What a rank reads to find its place: torch's names, distrun's and the interface choice. The
# launcher's own (Open MPI's, PMIx's, Slurm's) are passed by the prefixes it declares
# (``Launcher.env_prefixes``), whatever they are.
RANK_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
              "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "DISTRUN_HOST", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@dataclass(frozen=True)
class Container:
    image: str
    runtime: str = DEFAULT_RUNTIME
    # The id 'distrun push-image' last put on the nodes under the name (sha256:...), which every
    # node must hold (store/images.py); "" where the name was never pushed.
    image_id: str = ""


def image_asked(container: Container) -> dict[str, str]:
    """What the preflight asks of every node about an image: its reference, its runtime and, where
    'distrun push-image' pinned it, the id every node must hold."""
    return {"ref": container.image, "runtime": container.runtime, **({"id": container.image_id} if container.image_id else {})}


def check_image(ref: str, where: str) -> str:
    """The image reference, or one line naming ``where`` (the flag or variable) and the fix."""
    if not _IMAGE.fullmatch(ref):
        raise PlanError(f"{where} {ref!r} is not an image reference; write it as [registry[:port]/]name[:tag]"
                        "[@sha256:digest] in lower case, e.g. docker.io/library/python:3.11 or localhost/train:1")
    return ref


def check_runtime(name: str, where: str) -> str:
    if name not in RUNTIMES:
        raise PlanError(f"{where} {name!r}: choose one of {', '.join(RUNTIMES)}")
    return name


def choose(source: object, group_vars: Mapping[str, Any], image: str | None,
           runtime: str | None) -> Container | None:
    """The run's container: the flags win over the inventory's ``distrun_image`` and
    ``distrun_container_runtime``; None where neither names an image."""
    inv = f"inventory {source}:"
    inv_runtime = str(group_vars.get("distrun_container_runtime") or "")
    if inv_runtime:
        check_runtime(inv_runtime, f"{inv} distrun_container_runtime")
    chosen_runtime = runtime or inv_runtime or DEFAULT_RUNTIME
    if runtime:
        check_runtime(runtime, "--container-runtime")
    if image:
        return Container(check_image(image, "--image"), chosen_runtime)
    inv_image = str(group_vars.get("distrun_image") or "")
    if inv_image:
        return Container(check_image(inv_image, f"{inv} distrun_image"), chosen_runtime)
    if runtime:
        raise PlanError("--container-runtime needs an image: add --image REF (or distrun_image in the inventory)")
    return None


def pinned(container: Container | None, inventory: Path) -> Container | None:
    """The container with the id 'distrun push-image' last put on the inventory's nodes under its
    name (store/images.py), which the preflight then asks of every node."""
    if container is None:
        return None
    from distrun.store import images

    return replace(container, image_id=images.pushed_id(inventory, container.image, container.runtime))


def env_names(plan: JobPlan) -> list[str]:
    """Every variable a container gets, by name: the ranks' own, the plan's and the user's --env."""
    names = [*RANK_NAMES, *(k for k, _ in plan.program.env), *plan.program.user_env_keys]
    return list(dict.fromkeys(names))


def mounts(plan: JobPlan) -> list[str]:
    """The folders a container sees at their own paths: the shared folder, the run directory
    (inside it unless the plan says otherwise) and the workdir."""
    paths = [plan.shared_dir.rstrip("/") or "/", plan.run_dir, *([plan.program.workdir] if plan.program.workdir else [])]
    return list(dict.fromkeys(paths))


def run_argv(plan: JobPlan, *, per_rank: bool) -> list[str]:
    """The runtime's argv up to (not including) the image: fixed for every node of the run.

    ``per_rank``: one container per rank, started by the host's mpirun (the hybrid model): the
    ranks of a node sit in separate containers, yet Open MPI's shared-memory transport (vader)
    copies between them with process_vm_readv on its peers' pids, which only works in one pid
    namespace (``--pid=host``), and finds its peers' segments and the PMIx server of the host's
    orted in the session folder under /tmp (bound at /tmp): the unit's own /tmp, /dev/shm and IPC,
    never the node's, as podman's pause process starts in the unit (launch.py's runtime folder).
    """
    assert plan.launch.container is not None
    c = plan.launch.container
    # podman's cgroupfs manager: a rootless container then stays in its caller's cgroup, the run's
    # unit, which the run's end and `distrun stop` empty; the systemd manager would move it into
    # the user's own slice, out of their reach.
    argv = [c.runtime, *(["--cgroup-manager=cgroupfs"] if c.runtime == "podman" else []), "run", "--rm",
            "--network=host", "--ipc=host"]
    if per_rank:
        argv += ["--pid=host", "--volume", "/tmp:/tmp"]
    if c.runtime == "podman":
        # Rootless podman: the training user is the same uid inside, never root.
        argv.append("--userns=keep-id")
    argv += ["--label", f"{LABEL}={plan.run_id}"]
    for path in mounts(plan):
        argv += ["--volume", f"{path}:{path}"]
    argv += ["--workdir", plan.start_dir]
    for name in env_names(plan):
        argv += ["--env", name]
    return argv


def gpu_args(runtime: str, ids: tuple[int, ...] | None = None) -> list[str]:
    """How GPUs reach the container: CDI names for podman (one --device per GPU), the NVIDIA
    runtime's flag for docker; ``ids`` None: every GPU of the node."""
    if ids is None:
        return ["--device", "nvidia.com/gpu=all"] if runtime == "podman" else ["--gpus", "all"]
    if runtime == "podman":
        return [word for i in ids for word in ("--device", f"nvidia.com/gpu={int(i)}")]
    return ["--gpus", f'"device={",".join(str(int(i)) for i in ids)}"']


def _gpu_lines(plan: JobPlan, per_rank: bool) -> list[str]:
    """The GPUs each container gets, as the plan maps them (planning/gpus.py): one container per
    rank gets the GPUs its rank sees and their CUDA_VISIBLE_DEVICES renumbered as the container
    numbers them; one per node gets the node's selection (the rank wrapper inside renumbers). A
    node with GPUs the plan does not map gets them all."""
    assert plan.launch.container is not None
    runtime = plan.launch.container.runtime
    arms, whole = [], []
    for h in plan.placement.hosts:
        if not h.visible:
            if h.gpus > 0:
                whole.append(shlex.quote(h.name))
            continue
        if not per_rank:
            if h.gpu_ids:
                arms.append(f"  {shlex.quote(h.name)}) args+=({shlex.join(gpu_args(runtime, h.gpu_ids))}) ;;")
            continue
        by_value: dict[str, list[str]] = {}
        for local_rank, value in enumerate(h.visible):
            if value:
                by_value.setdefault(value, []).append(shlex.quote(f"{h.name}:{local_rank}"))
        for value, keys in by_value.items():
            ids = tuple(int(g) for g in value.split(","))
            arms.append(f"  {'|'.join(keys)}) args+=({shlex.join(gpu_args(runtime, ids))}); "
                        f"export CUDA_VISIBLE_DEVICES={shlex.quote(gpus.in_container(value, ids))} ;;")
    key = '"${DISTRUN_HOST:-}:${LOCAL_RANK:-}"' if per_rank else '"${DISTRUN_HOST:-}"'
    lines = [f"case {key} in", *arms, "esac"] if arms else []
    if whole:
        lines.append(f'case "${{DISTRUN_HOST:-}}" in {"|".join(whole)}) args+=({shlex.join(gpu_args(runtime))}) ;; esac')
    return lines


def script(plan: JobPlan, *, per_rank: bool, prefixes: tuple[str, ...]) -> str:
    """container-run.sh: starts the container on its node and runs its arguments inside.

    What only the node knows is added there: the launcher's variables by their prefix, docker's
    user (the caller's uid and gid: docker's daemon would start it as root), and the GPUs the plan
    gives the node or the rank (by DISTRUN_HOST and LOCAL_RANK, which the rank wrapper or the
    launch sets).
    """
    assert plan.launch.container is not None
    c = plan.launch.container
    lines = [
        "#!/bin/bash",
        f"# Container start for distrun run {' '.join(plan.run_id.split())}. Generated; do not edit.",
        "set -euo pipefail",
        f"args=({shlex.join(run_argv(plan, per_rank=per_rank))})",
    ]
    if c.runtime == "docker":
        lines.append('args+=(--user "$(id -u):$(id -g)")')
    if prefixes:
        patterns = "|".join(f"{p}*" for p in prefixes)
        # The node's Open MPI folders (mpirun gives its ranks them) are not the image's.
        node_own = "".join(f"OMPI_MCA_{name}) ;; " for name, _ in plan.launch.openmpi_params)
        lines.append(f'for name in $(compgen -e); do case "$name" in {node_own}{patterns}) args+=(--env "$name") ;; esac; done')
    lines += _gpu_lines(plan, per_rank)
    lines.append(f'exec "${{args[@]}}" {shlex.quote(c.image)} "$@"')
    return "\n".join(lines) + "\n"


def script_path(plan: JobPlan) -> str:
    return f"{plan.run_dir}/{SCRIPT}"


def files(plan: JobPlan, *, per_rank: bool, prefixes: tuple[str, ...]) -> dict[str, str]:
    """The run-directory file a launcher adds for a containerised plan ({} without an image);
    ``prefixes``: the launcher's own variables its ranks need (``Launcher.env_prefixes``)."""
    return {SCRIPT: script(plan, per_rank=per_rank, prefixes=prefixes)} if plan.launch.container else {}


def pyxis_args(plan: JobPlan) -> list[str]:
    """srun's options under Slurm's pyxis plugin: every task in a container of the image, as the
    submitting user, on the host's network, with the run's folders at their own paths; the job's
    environment passes through as it is (enroot's default), so no value is written here."""
    assert plan.launch.container is not None
    binds = ",".join(f"{p}:{p}" for p in mounts(plan))
    return [f"--container-image={plan.launch.container.image}", f"--container-mounts={binds}",
            f"--container-workdir={plan.start_dir}"]


# The runtime as the training user outside a run (a run's containers removed, push-image; the
# probe's userprobe.py alike, held equal by a unit test): in a unit with its own /run/user/<uid>,
# as a run's (launch.py), where podman's pause process starts and ends. "$1" user, "$2" limit (s).
USER_UNIT_PROPERTIES = ("PrivateTmp=yes", "PrivateIPC=yes", "TemporaryFileSystem=/dev/shm:mode=1777,nosuid,nodev",
                        "ProtectProc=invisible", "TemporaryFileSystem=/run/user/{uid}:mode=0700,uid={uid},gid={gid}")
USER_UNIT = (
    'u=$1; max=$2; shift 2\n'
    'if [ "$(id -u)" = 0 ] && [ -d /run/systemd/system ]; then\n'
    '  uid=$(id -u "$u") && gid=$(id -g "$u") && home=$(getent passwd "$u" | cut -d: -f6) || exit 125\n'
    '  exec systemd-run --quiet --pipe --wait --collect --uid="$uid" --gid="$gid" --working-directory=/ '
    + " ".join(f'-p "{p}"'.replace("{uid}", "$uid").replace("{gid}", "$gid") for p in USER_UNIT_PROPERTIES)
    + ' -p RuntimeMaxSec="$max" -p KillMode=control-group -p SendSIGKILL=yes'
    ' -E HOME="$home" -E USER="$u" -E LOGNAME="$u" -E XDG_RUNTIME_DIR="/run/user/$uid"'
    ' -E PATH=/usr/local/bin:/usr/bin:/bin -E LANG=C.UTF-8 -- "$@"\n'
    'elif [ "$(id -u)" = 0 ]; then exec runuser -u "$u" -- env -C / -u XDG_RUNTIME_DIR -u DBUS_SESSION_BUS_ADDRESS "$@"\n'
    'else exec "$@"; fi\n'
)


def in_user_unit(user: str, argv: list[str], max_s: int) -> list[str]:
    """argv as ``user`` in a unit of its own (USER_UNIT) for at most ``max_s`` s, started by root
    (else run as the user); its streams the caller's, its exit status the command's."""
    return ["sh", "-c", USER_UNIT, "sh", user, str(int(max_s)), *argv]


def stop_shell(plan: JobPlan) -> str:
    """``stop_argv`` as one shell line ("" without an image), for a stop sent as shell text beside
    another answer on stdout: the removed ids are dropped, an error still goes to stderr, and the
    line's status is the runtime's."""
    argv = stop_argv(plan)
    return f"{shlex.join(argv)} >/dev/null" if argv else ""


STOP_MAX_S = 60  # the unit that removes a run's containers on a node


def stop_argv(plan: JobPlan) -> list[str]:
    """Remove every container of the run on the node this runs on ([] for a run without an image).
    None there: exit 0. Run as root: rootless podman's, as their user in_user_unit."""
    if plan.launch.container is None:
        return []
    runtime = plan.launch.container.runtime
    ids = f"$({shlex.quote(runtime)} ps -aq --filter label={shlex.quote(f'{LABEL}={plan.run_id}')})"
    if runtime == "podman":
        return in_user_unit(plan.launch.user, ["podman", "rm", "-f", "--filter", f"label={LABEL}={plan.run_id}"],
                            STOP_MAX_S)
    # docker rm has no --filter: the ids come from docker ps.
    return ["sh", "-c", f'ids={ids}; [ -z "$ids" ] || docker rm -f $ids']


def image_record(plan: JobPlan, ids: Mapping[str, str]) -> str:
    """The run record's image.json: the image asked for and the id each node's probe found (none
    where the preflight was skipped: nothing was looked at)."""
    assert plan.launch.container is not None
    nodes = {h.name: ids.get(h.name) for h in plan.placement.hosts}
    return json.dumps({"ref": plan.launch.container.image, "runtime": plan.launch.container.runtime, "nodes": nodes,
                       "same": len(set(nodes.values()) - {None}) == 1 and None not in nodes.values()}, indent=2) + "\n"
