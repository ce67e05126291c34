"""A launcher's own options, declared by the launcher itself (a class attribute ``options``).

Each option has a name (the KEY of ``distrun train --launcher-opt KEY=VALUE``), the values it
takes (a few choices, or the rule of the inventory key that also sets it), one line of help,
that inventory key and a default. Its value comes from the command line, else the inventory,
else the default, and keeps where it came from, which the dry run shows. The CLI's help, its
checks and the plan's settings are all read from these declarations: a new option is one entry
in its launcher's file.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrun.errors import UserError

if TYPE_CHECKING:
    from distrun.launchers.base import Launcher

FLAG = "--launcher-opt"
COMMAND_LINE = "the command line"
DEFAULT = "the default"


@dataclass(frozen=True)
class LauncherOption:
    name: str
    help: str
    # The values it takes; without choices, the rule of inventory_key (inventory/values.py).
    choices: tuple[str, ...] = ()
    inventory_key: str | None = None
    default: str | None = None  # None: unset, the launcher leaves it to its tool
    unset: str = ""  # what an unset value means, for the help and the dry run
    metavar: str = "VALUE"

    def values(self) -> str:
        return "|".join(self.choices) if self.choices else self.metavar

    def problem(self, value: str) -> str | None:
        """The fix for a value this option does not take, or None when it takes it."""
        if self.choices:
            if value in self.choices:
                return None
            close = difflib.get_close_matches(value, self.choices, n=1, cutoff=0.5)
            return f"choose one of {', '.join(self.choices)}" + (f"; did you mean {close[0]}?" if close else "")
        from distrun.inventory.values import value_problem

        what = value_problem(self.inventory_key or "", value) or ("a value" if not value else None)
        return f"give {what}" if what else None

    def described(self) -> str:
        """One line for --help: name, values, what it does, where else it is set, its default."""
        default = self.default if self.default is not None else self.unset or "unset"
        where = f"inventory {self.inventory_key}; " if self.inventory_key else ""
        return f"{self.name}={self.values()}: {self.help} [{where}default: {default}]"


@dataclass(frozen=True)
class Resolved:
    """An option's value (None: unset) and where it came from."""

    value: str | None
    origin: str  # COMMAND_LINE, "inventory <key>" or DEFAULT


def option_named(launcher: Launcher, name: str) -> LauncherOption | None:
    return next((o for o in launcher.options if o.name == name), None)


def _valid_keys(launcher: Launcher) -> str:
    if not launcher.options:
        return f"--launcher {launcher.name} takes no {FLAG}; drop it"
    return f"--launcher {launcher.name} takes {', '.join(o.name for o in launcher.options)}"


def parse(launcher: Launcher, items: Sequence[str], registry: Mapping[str, Launcher]) -> dict[str, str]:
    """``--launcher-opt KEY=VALUE`` items -> {KEY: VALUE}, checked against the launcher's
    declaration; each mistake a UserError of one line naming the flag, the launcher, the item
    and what it takes."""
    got: dict[str, str] = {}
    for item in items:
        shown = repr(item.encode("utf-8", "backslashreplace").decode())
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{FLAG} {shown}: write it as KEY=VALUE; {_valid_keys(launcher)}")
        option = option_named(launcher, key)
        if option is None:
            names = [o.name for o in launcher.options]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            owners = [n for n, other in registry.items() if n != launcher.name and option_named(other, key)]
            hint = (f" (did you mean {close[0]}?)" if close else
                    f" ({key} is an option of --launcher {', '.join(owners)})" if owners else "")
            raise UserError(f"{FLAG} {shown}: --launcher {launcher.name} has no option {key!r}{hint}; "
                            f"{_valid_keys(launcher)}")
        if key in got:
            raise UserError(f"{FLAG} {shown}: --launcher {launcher.name}'s {key} is given twice "
                            f"({key}={got[key]} before); keep one")
        fix = option.problem(value)
        if fix:
            raise UserError(f"{FLAG} {shown}: --launcher {launcher.name}'s {key} does not take {value!r}; {fix}")
        got[key] = value
    return got


def resolve(launcher: Launcher, given: Mapping[str, str], inventory: Mapping[str, Any],
            source: Path | str) -> dict[str, Resolved]:
    """Every declared option's value: the command line's, else the inventory's, else the default."""
    out: dict[str, Resolved] = {}
    for option in launcher.options:
        if option.name in given:
            value = given[option.name]
            fix = option.problem(value)
            if fix:
                raise UserError(f"{FLAG} {option.name}={value!r}: --launcher {launcher.name}'s {option.name} "
                                f"does not take it; {fix}")
            out[option.name] = Resolved(value, COMMAND_LINE)
            continue
        found = inventory.get(option.inventory_key) if option.inventory_key else None
        if found:  # an empty or false value in the inventory leaves the option unset
            text = str(found)
            fix = option.problem(text)
            if fix:
                raise UserError(f"inventory {source}: {option.inventory_key} {text!r}: {fix}")
            out[option.name] = Resolved(text, f"inventory {option.inventory_key}")
            continue
        out[option.name] = Resolved(option.default, DEFAULT)
    return out


def help_text(registry: Mapping[str, Launcher]) -> str:
    """--launcher-opt's help, from the declarations: each launcher's options, then those with none."""
    parts = [f"{name}: " + "; ".join(o.described() for o in launcher.options)
             for name, launcher in registry.items() if launcher.options]
    none = [name for name, launcher in registry.items() if not launcher.options]
    tail = f" {', '.join(none)}: none." if none else ""
    return ("A setting of the chosen launcher, KEY=VALUE (repeatable); it wins over the inventory key, which wins "
            f"over the default. {'. '.join(parts)}.{tail}")


def option_lines(resolved: Mapping[str, Resolved], declared: Iterable[LauncherOption]) -> list[str]:
    """The dry run's lines: each option's value and where it came from."""
    rows: list[tuple[str, str, str]] = []
    for o in declared:
        r = resolved[o.name]
        rows.append((o.name, r.value if r.value is not None else f"unset: {o.unset or 'left to the launcher'}", r.origin))
    width = max((len(value) for _, value, _ in rows), default=0)
    return [f"  {name:<12} {value:<{width}}  (from {origin})" for name, value, origin in rows]
