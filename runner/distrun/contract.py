"""Defaults of the variables shared by inventory, roles and runner (see DEVELOPING.md).

The roles' ``defaults/main.yml`` state the same values; ``tests/unit/test_contract.py`` keeps
them equal, so the runner's dry-run never disagrees with what the playbooks do.
"""

from __future__ import annotations

HEAD_GROUP = "head"
WORKER_GROUP = "workers"

DEFAULT_USER = "distrun"
DEFAULT_SHARED_DIR = "/srv/distrun"
DEFAULT_MPI_PROVIDER = "venv"
DEFAULT_SHARED_FS_MODE = "sync"
SHARED_FS_MODES = ("nfs", "sshfs", "sync")
DEFAULT_ENV_PREFIX = {
    "venv": "/opt/distrun/venv",
    "conda": "/opt/miniforge3/envs/jittor",
}
# Where the MPI installation lives for each provider: mpirun's --prefix must point at it so
# remote orted daemons start from the same tree (the classic "orted: command not found").
MPI_PREFIX = {
    "venv": "/usr",
    "conda": None,  # the conda env itself
}
MPI_PROVIDERS = ("venv", "conda")

DEFAULT_MASTER_PORT = 29500
DEFAULT_SLOTS = 1


def hostfile_default(shared_dir: str) -> str:
    return f"{shared_dir.rstrip('/')}/hostfile"


def env_prefix_default(provider: str) -> str:
    return DEFAULT_ENV_PREFIX[provider]


def mpi_prefix(provider: str, env_prefix: str) -> str:
    fixed = MPI_PREFIX.get(provider)
    return fixed if fixed else env_prefix
