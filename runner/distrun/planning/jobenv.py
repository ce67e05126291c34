"""The variables every rank gets beyond the launcher's own, from three places, later ones winning:
the inventory's ``distrun_env`` (the cluster's, e.g. NCCL_DEBUG), the project's ``.distrun_env``
file in the workdir (like DeepSpeed's ``.deepspeed_env``; it may hold secrets), and ``--env``
(one run). Names are checked here; values travel only in the run's 0600 env.sh, which the rank
wrapper sources under every launcher: never in the plan, a launch script or an argv.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path

from distrun.errors import InventoryError, UserError
from distrun.inventory import contract
from distrun.inventory.cluster import Cluster
from distrun.planning.envnames import env_name_problem
from distrun.project.workdir import ENV_FILE


def inventory_env(cluster: Cluster) -> dict[str, str]:
    """The inventory's distrun_env, checked: names a shell exports, scalar values."""
    raw = cluster.group_vars.get("distrun_env")
    if raw is None or raw == "":
        raw = contract.defaults().get("distrun_env") or {}
    if not isinstance(raw, Mapping):
        raise InventoryError(f"inventory {cluster.source}: distrun_env must be a mapping of NAME: value, "
                             f"like {{NCCL_DEBUG: INFO}}; it is {type(raw).__name__}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        problem = env_name_problem(str(key))
        if problem:
            raise InventoryError(f"inventory {cluster.source}: distrun_env: {str(key)!r} {problem}")
        if value is None or isinstance(value, (Mapping, list)):
            raise InventoryError(f"inventory {cluster.source}: distrun_env: {key} needs a plain value (text or a number)")
        out[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (``export`` allowed, ``#`` comments, blank lines); the value is the rest
    of the line, with one pair of surrounding quotes removed; nothing is expanded."""
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc}); fix it or remove it") from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"{path} line {number}: write KEY=VALUE (one variable per line)")
        problem = env_name_problem(key)
        if problem:
            raise UserError(f"{path} line {number}: {key!r} {problem}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def env_file(workdir: Path | None) -> Path | None:
    if workdir is None:
        return None
    path = workdir / ENV_FILE
    return path if path.is_file() else None


def env_file_warning(workdir: Path | None) -> str | None:
    """A line when the project's env file is readable by other users of the controller."""
    path = env_file(workdir)
    if path is None:
        return None
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return (f"{path} is readable by other users of this machine (mode {mode:04o}); it may hold secrets: "
                f"chmod 600 {path}")
    return None


def run_env(cluster: Cluster, workdir: Path | None, cli_env: Mapping[str, str]) -> dict[str, str]:
    """Every variable the run's ranks get through env.sh: inventory, then the workdir's file, then --env."""
    merged = inventory_env(cluster)
    path = env_file(workdir)
    if path is not None:
        merged.update(read_env_file(path))
    merged.update(cli_env)
    return merged
