"""An inventory as Ansible itself reads it: ``ansible-inventory --list``, run with unparsed
sources and keys given twice made errors, its answer kept while the inventory's files are
unchanged (``inventory_cache``) with what breaks the contract found once beside it, and a source
Ansible cannot parse told in one line (the plugin's message and where).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError
from distrun.inventory import cache as inventory_cache
from distrun.inventory import contract
from distrun.inventory.values import EXAMPLE, check_source


def ansible_bin(tool: str) -> str:
    """Find an Ansible tool next to this interpreter first: the venv need not be activated."""
    beside = Path(sys.executable).parent / tool
    if beside.exists():
        return str(beside)
    found = shutil.which(tool)
    if not found:
        raise InventoryError(f"{tool} was not found next to {sys.executable} or on PATH; install distrun with pip")
    return found


# Where the answer keeps what breaks the contract (contract.problems), found when Ansible was asked.
CONTRACT_PROBLEMS = "_distrun_contract_problems"


def read_inventory_json(path: Path) -> dict[str, Any]:
    """What ``ansible-inventory --list`` says about the inventory; kept while its files are
    unchanged (inventory_cache), so a verb asks Ansible again only after an edit."""
    return inventory_cache.read(path, _ask_ansible)


def _ask_ansible(path: Path) -> dict[str, Any]:
    check_source(path)
    env = dict(os.environ)
    # Unparseable sources are warnings by default, which would turn a typo into an empty cluster.
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "True"
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    # A key given twice (a host, a variable) would silently keep the last: refused, with its line.
    env["ANSIBLE_DUPLICATE_YAML_DICT_KEY"] = "error"
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    proc = subprocess.run(
        [ansible_bin("ansible-inventory"), "-i", str(path), "--list"],
        capture_output=True, text=True, env=env, check=False,
    )
    if proc.returncode != 0:
        raise InventoryError(f"inventory {path}: Ansible cannot parse it: {parse_failure(proc.stderr, path)}")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"inventory {path}: ansible-inventory printed no JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InventoryError(f"inventory {path}: ansible-inventory printed no inventory")
    # The contract is checked here, once per change of the inventory's files, and what it finds
    # is kept with the answer (cluster_from_json refuses it): a run's playbook then skips role
    # distrun's own check of the same spec.
    data[CONTRACT_PROBLEMS] = contract.problems((data.get("_meta") or {}).get("hostvars"))
    return data


_PLUGIN_FAILED = re.compile(r"Failed to parse inventory with '([\w.]+)' plugin: (.*)")
_ORIGIN = re.compile(r"^Origin: (.+?)\s*$")


def parse_failure(stderr: str, path: Path) -> str:
    """What ansible-inventory said about a source it could not parse, in one line: the plugin's
    own message and where (``Origin: file:line:col``), from the plugin that fits the file best
    (the one that names a line, else the one its extension picks), else Ansible's last error."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    found: list[tuple[str, str, str]] = []  # (plugin, message, origin)
    for i, text in enumerate(lines):
        m = _PLUGIN_FAILED.search(text)
        if not m:
            continue
        origin = ""
        for later in lines[i + 1:]:
            if _PLUGIN_FAILED.search(later):
                break
            o = _ORIGIN.match(later)
            if o and not o.group(1).startswith("<"):
                origin = o.group(1)
                break
        found.append((m.group(1), m.group(2).strip(), origin))
    if not found:
        errors = [ln for ln in lines if ln.startswith("[ERROR]")]
        rest = [ln for ln in lines if ln]
        last = (errors[-1] if errors else rest[-1] if rest else "no output").removeprefix("[ERROR]: ")
        if "Completely failed to parse inventory source" in last:
            return f"no inventory plugin could read it as an inventory file; list the hosts in it, {EXAMPLE}"
        return last
    suffix = Path(found[0][2].split(":")[0] or str(path)).suffix.lower()
    preferred = ("yaml", "auto") if suffix in (".yml", ".yaml", ".json") else ("ini",)

    def rank(item: tuple[str, str, str]) -> tuple[bool, bool]:
        plugin, _, origin = item
        return (re.search(r":\d+:\d+$", origin) is None, plugin not in preferred)

    plugin, message, origin = min(found, key=rank)
    message = message.removeprefix("Failed to parse inventory: ").rstrip(".")
    if "not enough values to unpack" in message or "too many values to unpack" in message:
        message = ("a line that is neither a [group] header nor a host with key=value pairs (an unclosed "
                   "'[group', a stray word); close each header, e.g. [head]")
    where = f" at {origin}" if origin else ""
    fix = "; give each key once (keep one of the two, or merge them)" if "duplicate mapping key" in message else ""
    return f"{message}{where} ({plugin} plugin){fix}"
