"""Plans for unit tests: ``plan_for(cluster, run_id=..., launcher=..., workload=...)`` builds the
nested request (planning/request.py) from the flat names a test gives and plans it with the one
``build_plan`` every run uses, so a test names only what it is about."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from distrun.inventory.cluster import Cluster
from distrun.planning import plan as plan_module
from distrun.planning.containers import Container
from distrun.planning.jobplan import JobPlan
from distrun.planning.network import NetworkChoice
from distrun.planning.plan import build_plan
from distrun.planning.request import JobRequest, LaunchRequest, PlacementRequest, ProgramRequest, RunPolicy


def request_for(inventory: Path = Path("inventory"), *, launcher: str = "mpirun", np: int | None = None,
                workload: str | None = "gcn", script: str | Path | None = None, script_args: tuple[str, ...] | list[str] = (),
                dataset: str = "synthetic", data_dir: str | None = None, epochs: int | None = None,
                gdc: tuple[float, int] | None = None, workdir: str | Path | None = None,
                command: tuple[str, ...] | list[str] = (), prepare: tuple[str, ...] | list[str] = (),
                env: Mapping[str, str] | None = None, master_port: int = 29500, allow_gpu_mismatch: bool = False,
                hosts: tuple[str, ...] = (), exclude: tuple[str, ...] = (), slurm: Mapping[str, str] | None = None,
                launcher_args: tuple[str, ...] | list[str] = (), container: Container | None = None,
                image: str | None = None, container_runtime: str | None = None, gpus: int | None = None,
                gpu_ids: Mapping[str, tuple[int, ...]] | None = None, **policy: Any) -> JobRequest:
    """The request of those flat names: ``slurm`` (or any launcher's) options as --launcher-opt
    gives them, ``container`` as --image and --container-runtime, ``command`` the words after --
    with a workdir, ``gpus`` as --gpus and ``gpu_ids`` as --hosts host:0,1 name them."""
    return JobRequest(
        inventory=inventory,
        program=ProgramRequest(workload=workload or "gcn", script=Path(script) if script else None,
                               args=tuple(command) if workdir else tuple(script_args), dataset=dataset,
                               data_dir=data_dir, epochs=epochs, gdc=gdc, workdir=Path(workdir) if workdir else None,
                               prepare=tuple(prepare), env=dict(env or {})),
        placement=PlacementRequest(np=np, hosts=hosts, exclude=exclude, port=master_port,
                                   allow_gpu_mismatch=allow_gpu_mismatch, gpus=gpus,
                                   gpu_ids=tuple((gpu_ids or {}).items())),
        launch=LaunchRequest(launcher=launcher, options=dict(slurm or {}), args=tuple(launcher_args),
                             image=container.image if container else image,
                             container_runtime=container.runtime if container else container_runtime),
        policy=RunPolicy(**policy),
    )


def plan_for(cluster: Cluster, *, run_id: str, extra_env: Mapping[str, str] | None = None,
             network: NetworkChoice | None = None, restart: int = 0, **asked: Any) -> JobPlan:
    """``build_plan`` of the request ``request_for(**asked)``; ``extra_env``: the ranks' variables;
    ``workdir``: the project's folder on the nodes, as the plan holds it (the request's local
    folder is mapped to exactly that)."""
    if "command" in asked and "workdir" not in asked:
        asked["script_args"] = asked.pop("command")
    workdir = asked.get("workdir")
    with mock.patch.object(plan_module, "node_path", lambda shared_dir, local: str(workdir)):
        return build_plan(cluster, request_for(**asked), run_id=run_id, env=dict(extra_env or {}), network=network,
                          restart=restart)
