"""'distrun init': a new inventory folder from a head and its workers, ready for 'distrun setup'.

It writes ``hosts.yml`` (the hosts, their addresses, groups head and workers) and a commented
``group_vars/all.yml`` whose active values run the default workload on first contact: the
contract's defaults, Jittor and pymetis in the env, and the compiler Jittor builds with. Every
name is checked as 'distrun' checks an inventory, the result is read back through Ansible, and
an existing folder is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from distrun import paths
from distrun.errors import InventoryError, UserError
from distrun.inventory import contract
from distrun.inventory.cluster import load_cluster
from distrun.inventory.values import check_address, check_host_name

_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_USER = re.compile(r"[a-z_][a-z0-9_.-]*(@[A-Za-z0-9][A-Za-z0-9.-]*)?")


@dataclass(frozen=True)
class Written:
    files: tuple[Path, ...]
    head: str
    workers: tuple[str, ...]
    next_commands: tuple[str, ...]


def _host(spec: str, flag: str, where: Path) -> tuple[str, str | None]:
    """'w1' or 'w1=10.0.0.11' -> (name, address or None)."""
    name, sep, address = spec.strip().partition("=")
    name, address = name.strip(), address.strip()
    if not name or (sep and not address):
        raise UserError(f"{flag} {spec!r}: write NAME or NAME=ADDRESS, like w1 or w1=10.0.0.11")
    try:
        check_host_name(where, name)
    except InventoryError:
        raise UserError(f"{flag} {spec!r}: {name!r} is not a host name; use letters, digits and ._- "
                        "(not starting with -), and NAME=ADDRESS for an address") from None
    try:
        check_address(where, name, address or name)
    except InventoryError:
        raise UserError(f"{flag} {spec!r}: {address or name!r} is neither an IP address nor a DNS name") from None
    return name, (address or None)


def _key(text: str) -> str:
    """A YAML key or value that reads back as this very string ('on', '1e3' and 'null' need quotes)."""
    return text if yaml.safe_load(text) == text else json.dumps(text)


def hosts_yaml(folder: str, head: str, workers: list[str], addresses: dict[str, str | None]) -> str:
    lines = ["---", "# Written by 'distrun init'. Check it without contacting a host:",
             f"#   ansible-inventory -i {folder} --list", "all:", "  hosts:"]
    for name, address in addresses.items():
        lines.append(f"    {_key(name)}:")
        if address:
            lines.append(f"      ansible_host: {_key(address)}")
        lines.append("      # slots: 4            # ranks on this host; default: its GPU count, else 1")
    lines += ["  children:",
              "    # Exactly one head: starts mpirun and the rendezvous, runs --prepare, holds the shared folder.",
              "    head:", "      hosts:", f"        {_key(head)}:",
              "    # The hosts that run ranks; the head may be one of them (it is counted once).",
              "    workers:", "      hosts:", *(f"        {_key(w)}:" for w in workers)]
    return "\n".join(lines) + "\n"


def group_vars_yaml(admin_user: str | None) -> str:
    user_line = f"ansible_user: {_key(admin_user)}" if admin_user else "# ansible_user: admin"
    return f"""---
# Written by 'distrun init'. The contract's variables are described in DEVELOPING.md and every
# role option in docs/roles.md; uncomment and change what your cluster needs, then run setup.

# Connection: the account Ansible logs in with on every node. It needs sudo (passwordless, or
# ansible_become_password in an ansible-vault file), and each node's host key in your
# ~/.ssh/known_hosts (ssh to each node once).
{user_line}
ansible_python_interpreter: /usr/bin/python3

# The contract.
distrun_user: distrun              # the unprivileged training user, created on every node
distrun_shared_dir: /srv/distrun   # the folder every node sees: runs, workdirs, partitions
# sync (rsync from the head) | sshfs | external (the site's own) | nfs (server on the head): distrun's
# tests run the first three; nfs is only rendered there (their machines cannot mount NFS).
distrun_shared_fs_mode: sync
# venv (the distro's Open MPI and a venv; run in distrun's tests) | conda (Miniforge, openmpi=4.1.6;
# rendered there and run against a test-double installer: no real conda solve).
distrun_mpi_provider: venv

# Python packages in the env. The default workload ('distrun train' with no --workload) is the
# Jittor GCN over Metis parts: it needs jittor and pymetis, and Jittor compiles its kernels with
# g++ against the Python headers.
mpi_env_packages:
  - jittor>=1.3.11,<1.4
  - pymetis>=2025.2,<2026
  # - torch                        # --workload ddp, --launcher torchrun, your own torch programs
base_packages_extra: [g++, python3-dev]

# Variables every rank gets under every launcher ('distrun train --env' overrides one per run):
# distrun_env:
#   NCCL_DEBUG: INFO

# conda provider, as the seed pages use it (with distrun_mpi_provider: conda):
# distrun_env_prefix: {contract.env_prefix_default("conda")}
# mpi_env_conda_channels: [conda-forge]
# mpi_env_conda_installer_checksum: "sha256:<hex of the Miniforge installer>"
# The env pins python 3.11 and openmpi 4.1.6; the wiki's openmpi 4.0.5 solves only beside
# Python 3.9 or older (other pins that cannot be solved are refused before any play runs):
# mpi_env_conda_python_version: "3.9"
# mpi_env_conda_openmpi_version: "4.0.5"

# nfs: the training user needs the same uid on every node.
# base_user_uid: 2000

# Slurm for --launcher slurm (docs/guide/slurm.md):
# slurm_enabled: true
"""


def write_inventory(base_dir: Path, name: str, head_spec: str, workers_spec: str,
                    admin_user: str | None = None) -> Written:
    """Write base_dir/name/ and read it back through Ansible; what was written and what to run next."""
    if not _FOLDER.fullmatch(name):
        raise UserError(f"distrun init {name!r}: name the inventory with letters, digits and ._- (like prod)")
    if admin_user is not None and not _USER.fullmatch(admin_user):
        raise UserError(f"--user {admin_user!r}: give a login name such as admin (or admin@REALM)")
    target = base_dir / name
    if target.exists() or target.is_symlink():
        raise UserError(f"{target} already exists; choose another name or remove it (distrun init never overwrites)")
    head, head_address = _host(head_spec, "--head", target)
    addresses: dict[str, str | None] = {head: head_address}
    workers: list[str] = []
    for spec in (s for s in workers_spec.split(",") if s.strip()):
        worker, address = _host(spec, "--workers", target)
        known = addresses.get(worker)
        if worker in addresses and address and known and address != known:
            raise UserError(f"--workers {spec!r}: {worker} was given as {known} already")
        if worker in workers:
            raise UserError(f"--workers: {worker} is listed twice")
        addresses[worker] = known or address
        workers.append(worker)
    if not workers:
        raise UserError("--workers: name at least one host that runs ranks (the head may be one)")
    shown = os.path.relpath(target) if not os.path.relpath(target).startswith("..") else str(target)
    files = (target / "hosts.yml", target / "group_vars" / "all.yml")
    (target / "group_vars").mkdir(parents=True)
    try:
        paths.write_text(files[0], hosts_yaml(shown, head, workers, addresses))
        paths.write_text(files[1], group_vars_yaml(admin_user))
        load_cluster(target, admin=True)  # what 'distrun setup' will read, read now
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    named = target.resolve().parent == (Path.cwd() / "inventory").resolve()
    ref = name if named else shown
    return Written(files, head, tuple(workers), (
        f"distrun setup --inventory {ref}       # provision every node (run it again: changed=0)",
        f"distrun train --inventory {ref}       # the default workload on every rank",
    ))
