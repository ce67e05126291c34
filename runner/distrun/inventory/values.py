"""The inventory values that reach shells, ssh argv and #SBATCH lines, checked when the inventory
is loaded: one line naming the host, the value and the fix for a value that is not a name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError
from distrun.inventory import rules

# Inventory values end up in generated shell scripts, ssh argv and #SBATCH lines. They are
# quoted there too; these rules keep a value that is not a name out of the cluster at load time.
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_DNS = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
_USER = re.compile(r"[a-z_][a-z0-9_-]*[$]?")
# An ssh login: a name, or a Kerberos or directory one with its realm (alice@EXAMPLE.COM).
_LOGIN = re.compile(r"(?!-)[A-Za-z0-9._-]+(@[A-Za-z0-9][A-Za-z0-9.-]*)?")
# A path, a Slurm partition or time limit: printable, no space, no shell metacharacter.
_WORD = re.compile(r"[A-Za-z0-9._:,/@%+=-]+")
# Values that reach a shell or an #SBATCH line, and the rule each must follow.
_HEAD_VALUES = {
    "distrun_user": (_USER, "a user name such as distrun"),
    "distrun_shared_dir": (_WORD, "an absolute path of letters, digits and ._-/"),
    "distrun_env_prefix": (_WORD, "an absolute path of letters, digits and ._-/"),
    "distrun_hostfile": (_WORD, "an absolute path of letters, digits and ._-/"),
    "slurm_partition": (_NAME, "a partition name of letters, digits and ._-"),
    "slurm_time_limit": (_WORD, "a Slurm time such as 30 or 1-00:00:00"),
    "slurm_mode": (_NAME, "single or multi-job"),
    "slurm_srun_mpi": (_NAME, "an srun --mpi type such as pmix"),
}


def _shown(value: object) -> str:
    # repr() keeps a newline or an escape on the one line of the error.
    return repr(str(value))


def check_host_name(path: Path, name: str) -> None:
    if not _NAME.fullmatch(name) or name.startswith("-"):
        raise InventoryError(
            f"inventory {path}: host name {_shown(name)} is not a plain name; use letters, digits and ._- "
            "(not starting with -) and put the address in ansible_host"
        )


def check_address(path: Path, host: str, address: str) -> None:
    """An IP address or a DNS name: never an ssh option, never shell text, no space around it
    (it would reach MASTER_ADDR and the hostfile as it is)."""
    if address != address.strip():
        raise InventoryError(f"inventory {path}: host {host} has ansible_host={_shown(address)} with spaces around "
                             f"it; write the address alone (ansible_host: {address.strip()})")
    if rules.is_ip(address):
        return
    if address.startswith("-") or not _DNS.fullmatch(address):
        raise InventoryError(
            f"inventory {path}: host {host} has ansible_host={_shown(address)}; set it to an IP address or a DNS name"
        )


def value_problem(key: str, text: str) -> str | None:
    """What the value of inventory key ``key`` must be, when ``text`` is not that; None when it
    is (or the key has no rule). A launcher option that an inventory key also sets is checked
    by the same rule (launchers/options.py)."""
    rule, what = _HEAD_VALUES.get(key, (None, ""))
    if rule is None or (rule.fullmatch(text) and not text.startswith("-")):
        return None
    return what


def check_values(path: Path, host: str, hv: Mapping[str, Any]) -> None:
    """Inventory values that land in generated scripts: one rule each (see _HEAD_VALUES)."""
    for key, (rule, _) in _HEAD_VALUES.items():
        value = hv.get(key)
        if value is None or value == "":
            continue
        text = str(value)
        if rule is _WORD and "\n" not in text and text.startswith("{{"):
            continue  # a template only Ansible renders (distrun_hostfile's default); quoted wherever it lands
        what = value_problem(key, text)
        if what:
            raise InventoryError(f"inventory {path}: host {host} has {key}={_shown(text)}; set it to {what}")
    value = hv.get("distrun_iface")
    if value and (not _NAME.fullmatch(str(value)) or str(value).startswith("-")):
        raise InventoryError(f"inventory {path}: host {host} has distrun_iface={_shown(value)}; use letters, digits "
                             "and ._- only")
    for key in ("ansible_user", "ansible_ssh_user"):
        value = hv.get(key)
        if value and not _LOGIN.fullmatch(str(value)):
            raise InventoryError(f"inventory {path}: host {host} has {key}={_shown(value)}; give a login name of "
                                 "letters, digits and ._- (not starting with -), or NAME@REALM")
    check_port(path, host, hv.get("ansible_port"))


def check_port(path: Path, host: str, port: object) -> None:
    """ansible_port: a TCP port, 1 to 65535 (Ansible would pass 'abc' or 0 to ssh, which never
    reaches the node)."""
    if port is None or port == "":
        return
    text = str(port)
    if isinstance(port, bool) or not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise InventoryError(f"inventory {path}: host {host} has ansible_port={_shown(port)}; set it to the port "
                             "its sshd listens on, a whole number from 1 to 65535 (22 when unset)")


EXAMPLE = ("e.g. hosts.yml: 'all: {children: {head: {hosts: {w1: {ansible_host: 10.0.0.11}}}, "
           "workers: {hosts: {w1: {}}}}}' ('distrun init NAME --head w1=10.0.0.11 --workers w1' writes one)")


def check_source(path: Path) -> None:
    """What Ansible would only call 'failed to parse', said before it is asked: a folder with no
    inventory file in it, a file that is empty or that you may not read."""
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        files = [n for n in inside if n not in ("group_vars", "host_vars") and (path / n).is_file()]
        if not files and not any((path / n).is_dir() for n in inside if n not in ("group_vars", "host_vars")):
            held = f"only {', '.join(inside)}" if inside else "nothing"
            raise InventoryError(f"inventory {path}: the folder holds no inventory file ({held}); add one listing "
                                 f"the hosts, {EXAMPLE}")
        return
    try:
        with path.open("rb") as f:
            empty = not f.read(1)
    except PermissionError:
        raise InventoryError(f"inventory {path}: you may not read it; fix its permissions (chmod u+r {path})") from None
    except OSError as exc:
        raise InventoryError(f"inventory {path}: cannot be read ({exc.strerror}); give a readable file") from None
    if empty:
        raise InventoryError(f"inventory {path}: the file is empty; list the hosts in it, {EXAMPLE}")


def check_duplicates(path: Path, nodes: Mapping[str, Any]) -> None:
    """Two hosts at one address (and port) would be one machine counted twice: its slots, its
    ranks and its claim on the run's port."""
    seen: dict[tuple[str, str], str] = {}
    for name, node in nodes.items():
        hv = getattr(node, "hostvars", None) or {}
        key = (str(getattr(node, "address", name)).lower().rstrip("."), str(hv.get("ansible_port") or 22))
        if key in seen:
            raise InventoryError(f"inventory {path}: hosts {seen[key]} and {name} have the same address {key[0]} "
                                 f"(port {key[1]}); give each host its own ansible_host, or keep one of them")
        seen[key] = name


MAX_SLOTS = 1024


def check_slots(path: Path, host: str, slots: int) -> None:
    if slots > MAX_SLOTS:
        raise InventoryError(f"inventory {path}: host {host} has slots={slots}, more ranks than one machine runs; "
                             f"set slots to its GPU count (or cores), at most {MAX_SLOTS}")
