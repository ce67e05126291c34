"""What each command-line value may be, checked while the command line is read (before any node
is touched), each refusal one line naming the option and the fix; and what the shell completes
for the values that name something (inventories, run ids).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from click.shell_completion import CompletionItem

from distrun import paths
from distrun.errors import UserError

INVENTORY_ENV = "DISTRUN_INVENTORY"


class Bounded(click.ParamType):
    """A whole number within bounds, refused with the bounds as the fix."""

    name = "integer"

    def __init__(self, low: int, high: int | None = None, what: str = "") -> None:
        self.low, self.high, self.what = low, high, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            number = value
        else:
            text = str(value).strip()
            if not re.fullmatch(r"[+-]?[0-9]+", text):  # ASCII only: int() would read '３' too
                self.fail(f"{text!r} is not a whole number; {self._fix()}", param, ctx)
            number = int(text)
        if number < self.low or (self.high is not None and number > self.high):
            self.fail(f"{number} is out of range; {self._fix()}", param, ctx)
        return number

    def _fix(self) -> str:
        span = f"from {self.low} to {self.high}" if self.high is not None else f"of at least {self.low}"
        return f"give a whole number {span}{self.what}"


class OneOf(click.Choice):
    """A choice whose refusal lists the choices and the nearest one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.choices:
            return value
        choices = [str(c) for c in self.choices]
        same_letters = [c for c in choices if c.lower() == str(value).lower()]  # 'CORA', 'MPIRUN'
        close = same_letters or difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.fail(f"{value!r} is not one of {', '.join(choices)}{hint}", param, ctx)


PORT = Bounded(1, 65535, " (a free TCP port on the head node)")
RANKS = Bounded(1)
EPOCHS = Bounded(1)
RANK = Bounded(0, what=" (ranks count from 0)")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """--env KEY=VALUE (repeatable) -> {KEY: VALUE}: a shell variable name not reserved by distrun,
    a UTF-8 value, each name once."""
    from distrun.planning.envnames import env_name_problem

    env: dict[str, str] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        shown = key.encode("utf-8", "backslashreplace").decode()
        if not sep or not key:
            raise click.BadParameter(f"{pair.encode('utf-8', 'backslashreplace').decode()!r}: write it as KEY=VALUE", ctx, param)
        if not _ENV_NAME.fullmatch(key):
            raise click.BadParameter(f"{shown!r} is not a variable name; use letters, digits and _ "
                                     "(not starting with a digit)", ctx, param)
        problem = env_name_problem(key)  # the name rule above passed: what is left is a name distrun sets
        if problem:
            raise click.BadParameter(f"{key}: {problem.removeprefix('is refused: ')}", ctx, param)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise click.BadParameter(f"{key}: the value is not valid UTF-8; pass text (base64-encode binary values)",
                                     ctx, param) from None
        if key in env and env[key] != value:
            raise click.BadParameter(f"{key} is given twice with different values; keep one", ctx, param)
        env[key] = value
    return env


def script_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--script: a readable file whose name does not collide with a file distrun writes next to it."""
    from distrun.planning.run_files import clashes_with_run_dir

    if value is None:
        return None
    if not value.exists():
        raise click.BadParameter(f"{value}: no such file; pass the path of your training program", ctx, param)
    if not value.is_file():
        raise click.BadParameter(f"{value}: not a file; pass the path of your training program", ctx, param)
    if not os.access(value, os.R_OK):
        raise click.BadParameter(f"{value}: not readable by you; fix its permissions", ctx, param)
    name = value.name
    if not name.isprintable() or not utf8(name):
        raise click.BadParameter(f"{str(value)!r}: its name holds unprintable characters; rename it", ctx, param)
    if clashes_with_run_dir(name):
        raise click.BadParameter(f"{value}: distrun writes its own {name!r} in the run directory; rename your "
                                 "script (for example to train.py)", ctx, param)
    return value


def data_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise click.BadParameter(f"{value!r}: give an absolute path on the head node", ctx, param)
    return value


@dataclass(frozen=True)
class Inventory:
    label: str  # as the user gave it: what messages repeat ('distrun check --inventory prod')
    path: Path


def inventory(ctx: click.Context, param: click.Parameter, value: str | None) -> Inventory | None:
    """--inventory, else $DISTRUN_INVENTORY: a name under inventory/ or a path, resolved now."""
    if ctx.resilient_parsing:
        return None
    from_env = ctx.get_parameter_source(param.name or "inventory") == ParameterSource.ENVIRONMENT
    if value is None and os.environ.get(INVENTORY_ENV) is not None:  # set but empty: click reads it as unset
        value, from_env = os.environ[INVENTORY_ENV], True
    if value is None:
        raise click.UsageError(f"no inventory given: pass --inventory NAME|PATH (-i), or set {INVENTORY_ENV}", ctx)
    if not value.strip():
        where = f"{INVENTORY_ENV} is empty" if from_env else "--inventory is empty"
        raise click.UsageError(f"{where}: give a name under inventory/ (e.g. local) or a path", ctx)
    try:
        return Inventory(value, paths.resolve_inventory(value))
    except UserError as exc:
        if from_env:
            raise UserError(f"{INVENTORY_ENV}={value!r}: {str(exc).split(': ', 1)[1]}") from None
        raise


def run_ref(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from distrun.store.runs import check_run_ref

    if ctx.resilient_parsing:
        return value
    try:
        return check_run_ref(value)
    except UserError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from distrun.store.runs import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except UserError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[1], ctx, param) from None


# Ansible's own tags, beside those setup's playbooks and roles carry.
_SPECIAL_TAGS = ("all", "always", "never", "tagged", "untagged")


def setup_tags() -> set[str]:
    """Every tag setup.yml's playbooks and roles carry (the words of each 'tags:' line)."""
    root = paths.project_dir()
    found: set[str] = set(_SPECIAL_TAGS)
    for f in [*(root / "playbooks").glob("*.yml"), *(root / "roles").glob("*/tasks/*.yml")]:
        for m in re.finditer(r"^\s*-?\s*tags:\s*\[?([^\]\n]*)", f.read_text(), re.M):
            found |= {w.strip(" '\"") for w in m.group(1).split(",") if w.strip(" '\"")}
    return found


def tags(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """setup --tags: tags that exist (Ansible would go on and run nothing for a misspelt one)."""
    if value is None or ctx.resilient_parsing:
        return value
    words = [w.strip() for w in value.split(",")]
    if not any(words):
        raise click.BadParameter("is empty: give tags (comma-separated, e.g. --tags mpi_env,hostfile) or drop --tags",
                                 ctx, param)
    known = setup_tags()
    for word in words:
        if word not in known:
            close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            roles = sorted(t for t in known if (paths.project_dir() / "roles" / t).is_dir())
            raise click.BadParameter(f"{word!r} is no tag of setup; {hint}the roles' tags: {', '.join(roles)}", ctx, param)
    return value


def limit(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """setup --limit: a pattern that selects something (an empty one would select every host)."""
    if value is not None and not value.strip(" ,:"):
        raise click.BadParameter("is empty, and would mean every host: give hosts or groups (--limit w1,w2) or "
                                 "drop --limit", ctx, param)
    return value


def check_limit(inventory: Path, value: str | None, hosts: list[str], groups: list[str]) -> None:
    """Plain names in --limit must be hosts or groups of the inventory (Ansible would run on none
    and call it a success); patterns (*, ~, !, &) are Ansible's to read."""
    if not value:
        return
    for word in re.split(r"[,:]", value):
        word = word.strip()
        if word and re.fullmatch(r"[A-Za-z0-9._-]+", word) and word not in hosts and word not in groups:
            raise UserError(f"--limit {word}: no such host or group in inventory {inventory} (hosts: "
                            f"{', '.join(hosts)}); give one of them")


def utf8(text: str) -> bool:
    """Non-UTF-8 bytes in argv reach Python as lone surrogates, which can be written nowhere."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- shell completion -------------------------------------------------------------------------

def complete_inventory(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Names under inventory/ (here and the project's), then paths."""
    names: set[str] = set()
    if "/" not in incomplete:
        for d in paths.inventory_search_dirs():
            names |= {p.name for p in d.iterdir() if not p.name.startswith(".") and p.name.startswith(incomplete)}
    return [*(CompletionItem(n) for n in sorted(names)), CompletionItem(incomplete, type="file")]


def complete_run(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Run ids, newest first, and 'last'."""
    from distrun.store.runs import list_runs

    try:
        ids = [r.id for r in reversed(list_runs())]
    except (OSError, UserError):
        ids = []
    return [CompletionItem(i) for i in ["last", *ids] if i.startswith(incomplete)]


# --- shared options and arguments ------------------------------------------------------------

run_argument = click.argument("run_id", default="last", callback=run_ref, shell_complete=complete_run)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (docs/guide/cli.md).")
inventory_option = click.option(
    "--inventory", "-i", "inventory", envvar=INVENTORY_ENV, show_envvar=True, metavar="NAME|PATH",
    callback=inventory, shell_complete=complete_inventory,
    help=f"A name under inventory/ (e.g. local, test, prod) or a path to an inventory file or directory "
         f"(default: ${INVENTORY_ENV}).",
)
