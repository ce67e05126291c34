"""The job plan's records: what runs where (`Placement`), what every rank runs (`Program`), how it
is launched (`Launch`), which attempt it is (`AttemptInfo`), and `JobPlan` holding them with the
run's id and folders; `to_json`/`from_json`, the one place the plan becomes plan.json and back.

plan.json stays one flat object (the keys it has always had, in their order: `show --json`, `--dry-run
--json`, the cluster tests and scripts read it), so a run recorded by any distrun is read the same way."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from distrun.planning.containers import Container
from distrun.store import retiring
from distrun.transport import rundir


@dataclass(frozen=True)
class RankHost:
    name: str
    address: str
    slots: int  # ranks placed on this host by this job
    gpus: int
    iface: str | None
    # The address of the interface the ranks use (the cluster network), where known; torchrun's
    # agents announce it to their peers instead of the machine's hostname, which the other
    # nodes may not resolve.
    net_address: str = ""
    # The GPUs this run uses there and each local rank's (planning/gpus.py): the node's selection
    # (nvidia-smi indices; under a scheduler that picks them, only their count matters), each local
    # rank's own GPUs, and each local rank's CUDA_VISIBLE_DEVICES (none: the node's left as it is).
    gpu_ids: tuple[int, ...] = ()
    rank_gpus: tuple[tuple[int, ...], ...] = ()
    visible: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where the ranks run and how they find each other."""

    hosts: tuple[RankHost, ...]
    world_size: int
    master_addr: str
    master_port: int
    cidr: str | None
    # The one host distrun reaches where the launcher's scheduler places the ranks (a site's login
    # node, Launcher.login): it launches (submits); the rank hosts are the scheduler's. None elsewhere.
    login: RankHost | None = None

    @property
    def head(self) -> RankHost:
        """The host that launches: the first rank host, or the login node of a site's Slurm."""
        return self.login or self.hosts[0]

    @property
    def reached_hosts(self) -> tuple[str, ...]:
        """The rank hosts distrun itself contacts (stage, follow, stop, collect), besides the head."""
        return () if self.login else tuple(h.name for h in self.hosts)

    @property
    def watched_hosts(self) -> tuple[str, ...]:
        """The hosts whose answers tell the run's state: its rank hosts, or the login node of a
        site's Slurm (its driver follows the job there)."""
        return (self.login.name,) if self.login else tuple(h.name for h in self.hosts)

    @property
    def has_gpus(self) -> bool:
        return any(h.gpus > 0 for h in self.hosts)


@dataclass(frozen=True)
class Program:
    """What every rank runs, and what runs before it."""

    argv: tuple[str, ...]  # after the interpreter wrapper, e.g. (python, script, args...)
    env: tuple[tuple[str, str], ...]
    # Names of the user's --env variables. Their values never enter the plan (which is
    # recorded, and rendered into argv and launch scripts): they travel in env.sh, 0600.
    user_env_keys: tuple[str, ...] = ()
    workload: str | None = None
    partition: tuple[str, ...] | None = None  # the partitioner's argv, when the workload needs one
    partition_dir: str | None = None
    # --workdir: the project folder on the nodes, where ranks start (else the run dir).
    workdir: str | None = None
    # --prepare: its argv, run once on the head in the workdir before the launch.
    prepare: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    """How the ranks are started: the launcher and its settings, as whom, from which prefixes."""

    launcher: str
    user: str
    run_as_root: bool
    mpi_prefix: str
    env_prefix: str
    # --launcher-args: appended as given to mpirun, torchrun or srun.
    launcher_args: tuple[str, ...] = ()
    # The chosen launcher's settings: its --launcher-opt values and inventory keys, resolved
    # (launchers/options.py); plan.json's "launcher_options".
    options: Mapping[str, str] = field(default_factory=dict)
    # --image / distrun_image: every rank runs inside a container of this image (containers.py).
    container: Container | None = None
    # distrun_unit_limits: (name, value) resource limits of the run's units on the nodes (limits.py).
    unit_limits: tuple[tuple[str, str], ...] = ()
    # (name, value) MCA parameters that keep Open MPI to its installation's own files
    # (inventory/rules.openmpi_own_params): mpirun and its daemons get them; every rank, under
    # every launcher, as OMPI_MCA_ variables of the plan's env.
    openmpi_params: tuple[tuple[str, str], ...] = ()
    # The cluster has people (distrun_users): root's node programs are reached through the installed
    # entry point, never sent (transport.remote.node_command).
    people: bool = False


@dataclass(frozen=True)
class AttemptInfo:
    """Which attempt of the run this plan is."""

    restart: int = 0  # how many times distrun restarted the run before this attempt
    max_restarts: int = 0  # distrun's budget; torchrun also restarts its workers in place up to it
    # Each attempt's launcher, rank and marker files in a folder of its own (rundir.py); a recorded
    # plan.json without this key kept them at the top of the run dir (store/retiring.py).
    attempt_dirs: bool = True
    # A launcher that restarts a detached run itself (Launcher.restarts_itself) goes on with as few
    # as this many of the plan's hosts, the rendezvous host among them, when a node is lost
    # (--exclude-failed: torchrun's --nnodes MIN:MAX); 0: on every host of the plan or not at all.
    min_nodes: int = 0
    # A detached run restarted on the head by distrun's supervisor (Launcher.supervised), which
    # leaves a lost node out with --exclude-failed while the job still fits (--np asked: its ranks).
    supervised: bool = False
    exclude_failed: bool = False
    np_asked: bool = False


@dataclass(frozen=True)
class JobPlan:
    """One run's plan: its id and shared folder (every path of the run is built from them) and its parts."""

    run_id: str
    shared_dir: str
    placement: Placement
    program: Program
    launch: Launch
    attempt: AttemptInfo = AttemptInfo()

    @property
    def run_dir(self) -> str:
        return rundir.run_dir(self.shared_dir, self.run_id)

    @property
    def hostfile(self) -> str:
        return f"{self.run_dir}/{rundir.HOSTFILE}"

    @property
    def env_file(self) -> str:
        return f"{self.run_dir}/{rundir.ENV_FILE}"

    @property
    def wrapper(self) -> str:
        return f"{self.run_dir}/{rundir.WRAPPER}"

    @property
    def checkpoint_dir(self) -> str:
        """Per run, in the shared folder, outside the run directory: it survives restarts and
        is not collected with the logs."""
        return rundir.checkpoint_dir(self.shared_dir, self.run_id)

    @property
    def start_dir(self) -> str:
        """Where every rank starts: the workdir, else the run directory."""
        return self.program.workdir or self.run_dir


# plan.json's keys, in the order every distrun wrote them; a part's field is its own key except these.
KEYS = ("run_id", "launcher", "hosts", "world_size", "user", "run_as_root", "mpi_prefix", "env_prefix",
        "shared_dir", "program", "env", "master_addr", "master_port", "cidr", "workload", "partition",
        "partition_dir", "launcher_options", "user_env_keys", "restart", "max_restarts", "workdir", "prepare",
        "launcher_args", "login", "attempt_dirs", "container", "unit_limits", "openmpi_params", "min_nodes", "people",
        "supervised", "exclude_failed", "np_asked")
# Written only when set: a plan without them is the same file as before they existed.
OPTIONAL = ("unit_limits", "openmpi_params", "min_nodes", "people", "supervised", "exclude_failed", "np_asked")
_KEY_OF = {"argv": "program", "options": "launcher_options"}
_PARTS: tuple[tuple[str, type], ...] = (("placement", Placement), ("program", Program), ("launch", Launch),
                                         ("attempt", AttemptInfo))


def to_json(plan: JobPlan) -> dict[str, Any]:
    """The plan as plan.json's flat object (lists for tuples, objects for hosts and the container)."""
    flat: dict[str, Any] = {"run_id": plan.run_id, "shared_dir": plan.shared_dir}
    for name, _ in _PARTS:
        for key, value in asdict(getattr(plan, name)).items():
            flat[_KEY_OF.get(key, key)] = value
    for host in [*flat["hosts"], *([flat["login"]] if flat["login"] else [])]:  # no GPUs: as before the mapping
        for key in _HOST_GPU_KEYS:
            if not host[key]:
                del host[key]
    if flat["container"] and not flat["container"]["image_id"]:  # an image never pushed: as before pins existed
        del flat["container"]["image_id"]
    return json.loads(json.dumps({key: flat[key] for key in KEYS if flat[key] or key not in OPTIONAL}, default=str))


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(x)) for k, x in value)


_HOST_GPU_KEYS = ("gpu_ids", "rank_gpus", "visible")


def _host(value: Any) -> RankHost | None:
    if not value:
        return None
    gpus = {"gpu_ids": tuple(value.get("gpu_ids", ())), "rank_gpus": tuple(tuple(g) for g in value.get("rank_gpus", ())),
            "visible": tuple(value.get("visible", ()))}
    return RankHost(**{**value, **gpus})


_READ: dict[str, Callable[[Any], Any]] = {
    "hosts": lambda v: tuple(h for h in map(_host, v) if h is not None),
    "login": _host,
    "container": lambda v: Container(**v) if v else None,
    "argv": _tuple, "user_env_keys": _tuple, "prepare": _tuple, "launcher_args": _tuple,
    "env": _pairs,
    "partition": lambda v: None if v is None else tuple(v),
    "options": dict,
    "unit_limits": _pairs,
    "openmpi_params": _pairs,
}


def from_json(data: Mapping[str, Any]) -> JobPlan:
    """The plan a plan.json holds. A key this distrun does not know is a ValueError, a missing
    one without a default a TypeError; the forms store/retiring.py lists are read as today's."""
    data = {retiring.PLAN_KEYS_RENAMED.get(key, key): value for key, value in data.items()}
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown keys {', '.join(unknown)}")
    data = {"attempt_dirs": retiring.ATTEMPT_DIRS_WHEN_MISSING, **data}
    parts: dict[str, Any] = {}
    for name, cls in _PARTS:
        given = {f.name: _KEY_OF.get(f.name, f.name) for f in fields(cls)}
        parts[name] = cls(**{f: _READ.get(f, lambda v: v)(data[key]) for f, key in given.items() if key in data})
    return JobPlan(run_id=data["run_id"], shared_dir=data["shared_dir"], **parts)
