"""`ansible-inventory --list` output, kept and reused while the inventory's files are unchanged.

Asking Ansible costs a Python start-up and a parse (about 0.3 s for 3 hosts, seconds for
thousands) on every verb. The answer depends only on the inventory's files, Ansible's version
and configuration and a few environment variables, so it is kept under a key made of exactly
those: any change to any of them (a host var edited, a group_vars file added, a file behind a
symlinked folder such as group_vars/all) is a new key and Ansible is asked again. Inventories
whose answer depends on anything else are never kept: a script or an inventory plugin (their
hosts come from outside the files), vault-encrypted files (the answer would hold decrypted
secrets), and a value whose template calls a lookup (inventory/templated.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.inventory import sources

# Variables that change how Ansible reads an inventory (the rest of the environment does not).
_ENV_PREFIXES = ("ANSIBLE_INVENTORY", "ANSIBLE_VARS", "ANSIBLE_VAULT", "ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS",
                 "ANSIBLE_HOST_PATTERN", "ANSIBLE_JINJA2", "ANSIBLE_CONNECTION_PLUGINS")
_MAX_BYTES = 16 << 20
_KEEP = 16


def _ansible_cfg() -> Path | None:
    """The configuration file ansible-inventory would read, in Ansible's own search order."""
    env = os.environ.get("ANSIBLE_CONFIG")
    for candidate in ([Path(env)] if env else []) + [Path.cwd() / "ansible.cfg", Path.home() / ".ansible.cfg",
                                                     Path("/etc/ansible/ansible.cfg")]:
        if candidate.is_file():
            return candidate
    return None


def _versions() -> str:
    """Which Ansible answers: the installed ansible-core and ansible distributions, by the names
    of their dist-info folders (name and version) on this interpreter's path. Read from the folder
    listings, not importlib.metadata, whose import alone costs every verb tens of milliseconds."""
    found: set[str] = set()
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found.update(n for n in names if n.endswith(".dist-info") and n.lower().startswith(("ansible_core-", "ansible-")))
    return ",".join(sorted(found)) or "no ansible"


# An answer that holds something the files alone do not decide (a template's lookup) says so here.
NOT_KEPT = "_distrun_not_kept"


def read(path: Path, ask: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """The kept answer for this inventory, else ``ask(path)``'s (kept when it may be)."""
    key = cache_key(path)
    cached = load(key) if key else None
    if cached is not None:
        return cached
    data = ask(path)
    if key and not data.get(NOT_KEPT):
        store(key, data)
    return data


def cache_key(path: Path) -> str | None:
    """The key of this inventory's answer, or None when it must not be kept (see the module doc)."""
    path = path.resolve()
    files = sources.files(path)
    if files is None:
        return None
    h = hashlib.sha256()
    # An answer is kept only once the runner checked the contract (and the conda pins) in it.
    h.update(f"{path}\0{_versions()}\0contract and conda pins checked\0".encode())
    for k in sorted(k for k in os.environ if k.startswith(_ENV_PREFIXES)):
        h.update(f"env {k}={os.environ[k]}\0".encode())
    cfg = _ansible_cfg()
    if cfg is not None:
        h.update(b"cfg\0" + cfg.read_bytes() + b"\0")
    total = 0
    for f in files:
        try:
            st = f.stat()
            data = f.read_bytes()
        except OSError:
            return None
        total += len(data)
        if total > _MAX_BYTES or st.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
            return None  # a script inventory: its answer comes from elsewhere
        if b"$ANSIBLE_VAULT" in data or _is_plugin_config(data):
            return None
        h.update(f"file {f.relative_to(path if path.is_dir() else path.parent)}\0".encode() + data + b"\0")
    return h.hexdigest()[:32]


def _is_plugin_config(data: bytes) -> bool:
    """An inventory plugin's configuration (``plugin: aws_ec2``): its hosts come from an API."""
    return any(line.startswith(b"plugin:") for line in data.splitlines())


def _folder() -> Path:
    folder = paths.state_dir() / "inventory"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def load(key: str) -> dict[str, Any] | None:
    f = _folder() / f"{key}.json"
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store(key: str, data: dict[str, Any]) -> None:
    folder = _folder()
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        tmp.unlink(missing_ok=True)
        return
    kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in kept[:-_KEEP]:
        old.unlink(missing_ok=True)
