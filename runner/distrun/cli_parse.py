"""How the command line is read and how its mistakes are told: one line on stderr naming the
option or argument and the fix, exit 2, never a traceback or a usage screen. Program arguments
come only after ``--``; an unknown option or verb gets a "did you mean".
"""

from __future__ import annotations

import difflib
import errno
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from . import ui
from .cli_params import utf8
from .errors import EXIT_CODES, UserError

USAGE_EXIT = 2


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def usage_line(exc: click.ClickException) -> str:
    """Click's account of a command-line mistake, as one line with the fix."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "distrun"
    verb = " ".join(path.split()[1:])
    where = f"{verb}: " if verb else ""
    if isinstance(exc, click.NoSuchOption):
        names = [o for p in (ctx.command.params if ctx else []) for o in getattr(p, "opts", []) if o.startswith("-")]
        hint = _suggest(exc.option_name, names) or _suggest(exc.option_name, exc.possibilities or [])
        return (f"{where}no such option {exc.option_name}{hint} ('{path} --help' lists them); "
                "arguments for your program go after '--'")
    if isinstance(exc, click.BadOptionUsage) and "requires" in exc.message:
        return f"{where}{exc.option_name} needs a value ('{path} --help' says which)"
    if isinstance(exc, click.MissingParameter) and isinstance(exc.param, click.Argument):
        return f"{where}missing argument {exc.param.human_readable_name!r} ('{path} --help' shows what it takes)"
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        param = exc.param
        given = exc.param_hint
        hint = (given if isinstance(given, str) else " / ".join(given)) if given else (
            max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name)
        return f"{where}{hint}: {exc.message.rstrip('.')}"
    return f"{where}{exc.format_message().rstrip('.')}"


def exit_now(code: str | int | None) -> NoReturn:
    """End the process with a SystemExit's code, without tearing the interpreter down: tens of
    milliseconds of freeing modules that whoever waits for distrun (a script, a benchmark, the
    shell) would wait for too. Exit handlers run and output is flushed first; while a thread that
    is not a daemon still runs, Python's own exit does it all (it waits for such threads and ends
    idle thread pools)."""
    import atexit
    import threading

    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("text"): the text on stderr, status 1, as Python does
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers Python's exit would run
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away, or a closed stream: nothing more can be told
    os._exit(status)


def _fail(message: str, code: int) -> NoReturn:
    ui.fatal(message)
    sys.exit(code)


class Group(click.Group):
    """distrun's verbs. Every mistake a user can make ends here as one line and an exit code."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        ui.configure()
        try:
            rv = super().main(args, prog_name or "distrun", complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            _fail(usage_line(exc), exc.exit_code if exc.exit_code else USAGE_EXIT)
        except UserError as exc:  # raised while the options were read (an inventory, a run id)
            _fail(str(exc), exc.exit_code)
        except click.Abort:  # Ctrl-C: click turns KeyboardInterrupt into Abort
            _fail("interrupted", 130)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            # The reader went away (distrun runs | head): stop quietly, as other tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            hint = _suggest(name, self.list_commands(ctx))
            raise click.UsageError(f"no such command {name!r}{hint} ('distrun --help' lists them)", ctx)
        return super().resolve_command(ctx, args)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Exit codes"):
            formatter.write_dl([(str(code), meaning) for code, meaning in EXIT_CODES])


class Command(click.Command):
    """A verb that takes no positional argument it does not declare."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.allow_extra_args = True
        try:
            rest = super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.ctx = exc.ctx or ctx  # click's parser leaves it out: the line then names the verb
            raise
        if ctx.args and not ctx.resilient_parsing:
            self.refuse_extra(ctx, ctx.args)
        return rest

    def refuse_extra(self, ctx: click.Context, extra: list[str]) -> NoReturn:
        raise click.UsageError(f"unexpected argument {extra[0]!r} ('{ctx.command_path} --help' shows what it takes)", ctx)


class ProgramCommand(Command):
    """A verb whose program arguments come only after ``--`` (``train``): before it, every word
    is distrun's; after it, every word is the program's, passed on untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        program: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, program = args[:cut], args[cut + 1:]
        for i, word in enumerate(program, 1):
            if not utf8(word):
                raise click.UsageError(f"program argument {i} after '--' is not valid UTF-8; pass text", ctx)
        rest = super().parse_args(ctx, args)
        ctx.params["program_args"] = tuple(program)
        return rest

    def refuse_extra(self, ctx: click.Context, extra: list[str]) -> NoReturn:
        word = extra[0]
        raise click.UsageError(
            f"unexpected argument {word!r}: your program goes in --script {word if word.endswith('.py') else 'FILE'}, "
            f"its arguments after '--' ({ctx.command_path} -i NAME --script train.py -- --lr 0.1)", ctx)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- PROGRAM_ARGS...]"]
