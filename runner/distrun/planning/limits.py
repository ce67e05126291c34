"""The resource limits of a run's processes on each node (``distrun_unit_limits`` in the
inventory): the unit a run's launcher runs in on a node gets them (role job's launch.py, as
``LimitMEMLOCK=`` and the like), where an ssh login would have had the site's PAM limits
(``/etc/security/limits.conf``) and a unit gets systemd's defaults instead. InfiniBand and RDMA
need ``memlock: infinity``; a site that raised ``nofile`` for its logins raises it here too."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from distrun.errors import PlanError

VARIABLE = "distrun_unit_limits"
# The names a run may set (setrlimit's, as systemd's Limit*= properties take them).
NAMES = ("as", "core", "data", "fsize", "memlock", "nofile", "nproc", "stack")
_VALUE = re.compile(r"(?:[0-9]{1,19}|infinity)(?::(?:[0-9]{1,19}|infinity))?")


def _value(raw: object) -> str | None:
    """systemd's spelling of one limit (N, infinity, or SOFT:HARD), or None when it is none."""
    if isinstance(raw, bool):
        return None
    text = str(raw).strip().lower().replace("unlimited", "infinity")
    return text if _VALUE.fullmatch(text) else None


def from_inventory(source: object, group_vars: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The inventory's limits, checked: (name, value) pairs in NAMES' order; none when unset."""
    given = group_vars.get(VARIABLE)
    if given in (None, "", {}):
        return ()
    where = f"inventory {source}: {VARIABLE}"
    if not isinstance(given, Mapping):
        raise PlanError(f"{where} must be a mapping of limit names to values, e.g. {{memlock: infinity, nofile: 65536}}")
    out = {}
    for name, raw in given.items():
        if str(name) not in NAMES:
            raise PlanError(f"{where}: {name!r} is not a limit distrun sets; use {', '.join(NAMES)}")
        value = _value(raw)
        if value is None:
            raise PlanError(f"{where}: {name}: {raw!r} is not a limit; write a number, infinity, or SOFT:HARD")
        out[str(name)] = value
    return tuple((n, out[n]) for n in NAMES if n in out)

