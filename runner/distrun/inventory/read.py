"""An inventory as Ansible itself reads it: ``ansible-inventory --list``, run with unparsed
sources and keys given twice made errors, its answer kept while the inventory's files are
unchanged (``inventory_cache``) with what breaks the contract found once beside it, and a source
Ansible cannot parse told in one line (the plugin's message and where).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from distrun.errors import InventoryError
from distrun.inventory import cache as inventory_cache
from distrun.inventory import contract, sources, templated
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


def timeout_s() -> float:
    """How long ansible-inventory may take (a dynamic inventory script that hangs would hold
    every verb for ever): DISTRUN_INVENTORY_TIMEOUT_S, else 120 s."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise InventoryError(f"{TIMEOUT_ENV}={text!r}: give the seconds ansible-inventory may take, a number above 0 "
                             f"(default {DEFAULT_TIMEOUT_S:.0f})")
    return value


TIMEOUT_ENV = "DISTRUN_INVENTORY_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0


def _ask_ansible(path: Path) -> dict[str, Any]:
    check_source(path)
    files = sources.files(path)
    if files is not None:
        sources.check(path, files)
    wait = timeout_s()
    env = dict(os.environ)
    # Unparseable sources are warnings by default, which would turn a typo into an empty cluster.
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "True"
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    # A key given twice (a host, a variable) would silently keep the last: sources.check refused
    # it, with its line. Ansible itself would also take a key that overrides one a merge key (<<)
    # brought in for one given twice, which YAML allows: where every file was checked, it says nothing.
    env["ANSIBLE_DUPLICATE_YAML_DICT_KEY"] = "ignore" if files is not None else "error"
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    with subprocess.Popen([ansible_bin("ansible-inventory"), "-i", str(path), "--list"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # the script it runs too
            proc.communicate()
            what = "its script" if sources.is_script(path) else "Ansible (or an inventory script or plugin it ran)"
            raise InventoryError(f"inventory {path}: {what} gave no answer in {wait:g}s and was stopped; make the "
                                 f"script answer (run it with --list yourself), or give it longer with "
                                 f"{TIMEOUT_ENV}=SECONDS") from None
    if proc.returncode != 0:
        raise InventoryError(f"inventory {path}: Ansible cannot parse it: {parse_failure(err, path)}")
    try:
        data = json.loads(out)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"inventory {path}: ansible-inventory printed no JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InventoryError(f"inventory {path}: ansible-inventory printed no inventory")
    if templated.render(path, data):
        data[inventory_cache.NOT_KEPT] = True
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
    # An executable file is a script: what its run said, never another plugin's reading of its
    # source. A YAML file: the YAML plugin's words before auto's (which only looks for 'plugin:').
    if sources.is_script(path):
        preferred: tuple[str, ...] = ("script",)
    elif suffix in sources.YAML_SUFFIXES:
        preferred = ("yaml", "auto")
    else:
        preferred = ("ini",)

    def rank(item: tuple[str, str, str]) -> tuple[bool, int]:
        plugin, _, origin = item
        order = preferred.index(plugin) if plugin in preferred else len(preferred)
        return (plugin != "script" and re.search(r":\d+:\d+$", origin) is None, order)

    plugin, message, origin = min(found, key=rank)
    if plugin == "script":
        return _script_failure(message, lines)
    message = message.removeprefix("Failed to parse inventory: ").rstrip(".")
    if "not enough values to unpack" in message or "too many values to unpack" in message:
        message = ("a line that is neither a [group] header nor a host with key=value pairs (an unclosed "
                   "'[group', a stray word); close each header, e.g. [head]")
    where = f" at {origin}" if origin else ""
    fix = "; give each key once (keep one of the two, or merge them)" if "duplicate mapping key" in message else ""
    if "recursive dependency loop" in message:
        fix = "; a group cannot be among its own children, however deep: remove one of the two 'children' entries"
    return f"{message}{where} ({plugin} plugin){fix}"


def _script_failure(message: str, lines: list[str]) -> str:
    """A dynamic inventory script that failed or printed no inventory: what Ansible said of it
    and the first line of what it wrote on stderr."""
    said = ""
    for i, text in enumerate(lines):
        if text.startswith("Standard error from inventory script:"):
            said = next((ln for ln in lines[i + 1:] if ln), "")
            break
    message = message.removeprefix("Failed to parse inventory: ").rstrip(".")
    stderr = f"; it said on stderr: {said}" if said else ""
    return (f"the inventory script failed: {message}{stderr} (script plugin); run it with --list yourself: it must "
            "exit 0 and print the inventory as JSON")
