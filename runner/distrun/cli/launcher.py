"""The launcher's part of train's command line, all of it from the launchers' registry:
--launcher's choices and help, --launcher-opt KEY=VALUE read against the chosen launcher's
declared options (and --slurm-mode, its older spelling of mode=), --launcher-args against the
options the launcher's own command line gets from distrun."""

from __future__ import annotations

from typing import Any

import click

from distrun.cli.params import OneOf
from distrun.errors import UserError
from distrun.launchers import LAUNCHERS
from distrun.launchers.options import FLAG, help_text, option_named, parse

# The Slurm launcher's mode option had a flag of its own before launchers declared options.
ALIAS, ALIAS_OF = "--slurm-mode", ("slurm", "mode")


def launcher_option(fn: Any) -> Any:
    """--launcher: its choices and help from the launchers' registry."""
    said = "; ".join(f"{name}: {launcher.summary}" for name, launcher in LAUNCHERS.items())
    return click.option("--launcher", type=OneOf(list(LAUNCHERS)), default="mpirun", show_default=True,
                        help=f"How the ranks start: {said}.")(fn)


class _DeclaredHelp(click.Option):
    """An option whose help is written from the launchers' declarations when --help is asked."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = help_text(LAUNCHERS)
        return super().get_help_record(ctx)


def _alias_choices() -> list[str]:
    owner = LAUNCHERS.get(ALIAS_OF[0])
    option = option_named(owner, ALIAS_OF[1]) if owner else None
    return list(option.choices) if option else []


def launcher_opt_options(fn: Any) -> Any:
    """--launcher-opt (repeatable) and its alias --slurm-mode."""
    fn = click.option(ALIAS, "slurm_mode", type=OneOf(_alias_choices()), default=None,
                      help=f"With --launcher slurm: the same as {FLAG} mode=VALUE.")(fn)
    return click.option(FLAG, "launcher_opt", cls=_DeclaredHelp, multiple=True, metavar="KEY=VALUE")(fn)


def launcher_options(ctx: click.Context) -> dict[str, str]:
    """The --launcher-opt values train was given (with --slurm-mode's), checked against the
    chosen launcher's declaration: a mistake is one line, exit 2, before anything starts."""
    params = ctx.params
    name = params.get("launcher") or "mpirun"
    alias = params.get("slurm_mode")
    if alias is not None and name != ALIAS_OF[0]:
        raise click.UsageError(f"{ALIAS} goes with --launcher {ALIAS_OF[0]} (this run uses {name}); "
                               f"add --launcher {ALIAS_OF[0]} or drop {ALIAS}", ctx)
    try:
        got = parse(LAUNCHERS[name], params.get("launcher_opt") or (), LAUNCHERS)
    except UserError as exc:
        raise click.UsageError(str(exc), ctx) from None
    key = ALIAS_OF[1]
    if alias is not None and key in got and got[key] != alias:
        raise click.UsageError(f"{ALIAS} {alias} and {FLAG} {key}={got[key]} disagree: --launcher {name}'s {key} "
                               f"is given twice; keep one of them", ctx)
    if alias is not None:
        got[key] = alias
    return got


def check_launcher_args(launcher: str, words: tuple[str, ...]) -> None:
    """--launcher-args must add to what distrun gives the launcher (its owned_args), not give it again."""
    owned = LAUNCHERS[launcher].owned_args if launcher in LAUNCHERS else ()
    if words and launcher in LAUNCHERS and not LAUNCHERS[launcher].takes_args:
        raise UserError(f"--launcher-args: --launcher {launcher} has no command line of its own to extend; drop "
                        "--launcher-args and pass your program's options after '--'")
    for word in words:
        name = word.split("=", 1)[0]
        if name in owned:
            raise UserError(f"--launcher-args {word!r}: distrun already gives {launcher} {name} (from the inventory "
                            "and the other options); drop it, and set that through distrun's own option "
                            "(--np, --hosts, --port) or the inventory")
    params = LAUNCHERS[launcher].owned_params if launcher in LAUNCHERS else {}
    for option, param in zip(words, words[1:], strict=False):
        why = params.get(option, {}).get(param)
        if why:
            raise UserError(f"--launcher-args '{option} {param}': distrun sets {launcher}'s {param} itself ({why}); drop it")


def check_detached_restarts(name: str, exclude_failed: bool) -> None:
    """train --detach --max-restarts [--exclude-failed]: a launcher that restarts a run by itself
    on the nodes (Launcher.restarts_itself: torchrun's agents, on all the run's nodes) or that
    distrun's supervisor restarts on the head (Launcher.supervised: mpirun, which may leave a lost
    node out) takes it; the others restart only while distrun follows the run."""
    launcher = LAUNCHERS[name]
    if launcher.supervised:
        return
    if launcher.restarts_itself and not exclude_failed:
        return
    supervised = " or ".join(f"--launcher {n}" for n, one in LAUNCHERS.items() if one.supervised)
    if launcher.restarts_itself:
        raise click.UsageError(f"--detach --max-restarts --exclude-failed: --launcher {name} restarts a detached run on all "
                               f"its nodes only; use {supervised} (distrun's supervisor on the head leaves a lost node "
                               "out), drop --exclude-failed, or drop --detach")
    can = " or ".join(f"--launcher {n}" for n, one in LAUNCHERS.items() if one.restarts_itself or one.supervised)
    instead = f"use {can} (it restarts a detached run on the nodes by itself), " if can else ""
    raise click.UsageError(f"--detach and --max-restarts: --launcher {name} restarts a run only while distrun follows it; "
                           f"{instead}drop --detach (keep the terminal in tmux or screen) or drop --max-restarts")
