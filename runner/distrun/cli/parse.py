"""How the command line is read and how its mistakes are told: one line on stderr naming the
option or argument and the fix, exit 2, never a traceback or a usage screen. Program arguments
come only after ``--``; an unknown option or verb gets a "did you mean".
"""

from __future__ import annotations

import difflib
import errno
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from distrun import terminating
from distrun.cli.edges import (
    closed_streams,
    fail,
    os_error_line,
    output_lost,
    plain_encoding,
    silence,
    utf8_locale,
    working_folder,
)
from distrun.cli.params import utf8
from distrun.errors import ExitCode, UserError
from distrun.ui import console as ui

USAGE_EXIT = ExitCode.USAGE


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _long_name(ctx: click.Context | None, option: str) -> str:
    """-i as the user reads it in --help: --inventory."""
    for param in ctx.command.params if ctx is not None else []:
        opts = getattr(param, "opts", [])
        if option in opts:
            return max(opts, key=len)
    return option


def usage_line(exc: click.ClickException) -> str:
    """Click's account of a command-line mistake, as one line with the fix."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "distrun"
    verb = " ".join(path.split()[1:])
    where = f"{verb}: " if verb else ""
    if isinstance(exc, click.NoSuchOption):
        names = [o for p in (ctx.command.params if ctx else []) for o in getattr(p, "opts", []) if o.startswith("-")]
        hint = _suggest(exc.option_name, names) or _suggest(exc.option_name, exc.possibilities or [])
        program = "; arguments for your program go after '--'" if isinstance(ctx and ctx.command, ProgramCommand) else ""
        return f"{where}no such option {exc.option_name}{hint} ('{path} --help' lists them){program}"
    if isinstance(exc, click.BadOptionUsage):
        flag = _long_name(ctx, exc.option_name)
        if "requires" in exc.message:
            return f"{where}{flag} needs a value ('{path} --help' says which)"
        if "does not take a value" in exc.message:
            return f"{where}{flag} is a flag and takes no value: write {flag} alone"
    if isinstance(exc, click.MissingParameter) and isinstance(exc.param, click.Argument):
        return f"{where}missing argument {exc.param.human_readable_name!r} ('{path} --help' shows what it takes)"
    if isinstance(exc, click.MissingParameter) and isinstance(exc.param, click.Option):
        flag = max(exc.param.opts, key=len)
        return f"{where}{flag} is required: add {flag} {exc.param.metavar or 'VALUE'} ('{path} --help' says what it takes)"
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        param = exc.param
        given = exc.param_hint
        hint = (given if isinstance(given, str) else " / ".join(given)) if given else (
            max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name)
        return f"{where}{hint}: {exc.message.rstrip('.')}"
    return f"{where}{exc.format_message().rstrip('.')}"


class _ReaderGone(Exception):  # noqa: N818 - not an error of the user's
    """EPIPE on distrun's output, carried past click (whose main would exit 1 for it itself)."""


class _ShortUsage(click.UsageError):
    """Bare 'distrun': how to start, on stderr, without an error prefix."""


class Group(click.Group):
    """distrun's verbs. Every mistake a user can make ends here as one line and an exit code."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        closed = closed_streams()
        terminating.install()
        plain_encoding()
        ui.configure()
        if closed:
            what = " and ".join(f"standard {'output' if n == 'stdout' else 'error'}" for n in closed)
            line = f"{what} closed (>&-); give distrun a file, a pipe or /dev/null (> /dev/null)"
            if "stderr" in closed and "stdout" not in closed:
                print(f"distrun: error: {line}", file=sys.stdout, flush=True)  # the only stream left
                sys.exit(ExitCode.LOCAL_IO)
            fail(line, ExitCode.LOCAL_IO)
        working_folder()
        utf8_locale()
        try:
            try:
                rv = super().main(args, prog_name or "distrun", complete_var, standalone_mode=False, **extra)
                sys.stdout.flush()  # a full disk or a closed pipe on stdout is told here, not at exit
            except SystemExit:  # a verb's own exit code: unless its output was lost on the way
                output_lost()
                raise
            output_lost()
        except _ShortUsage as exc:
            click.echo(exc.message, err=True)
            sys.exit(USAGE_EXIT)
        except click.ClickException as exc:
            fail(usage_line(exc), exc.exit_code if exc.exit_code else USAGE_EXIT)
        except UserError as exc:  # raised while the options were read (an inventory, a run id)
            fail(str(exc), exc.exit_code)
        except click.Abort:  # Ctrl-C: click turns KeyboardInterrupt into Abort
            fail(terminating.word(), terminating.exit_code())
        except _ReaderGone:
            silence(1)  # the reader went away (distrun runs | head): quietly, as other tools do
            sys.exit(ExitCode.LOCAL_IO)
        except OSError as exc:
            if exc.filename is None and exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT):
                silence(1)  # distrun's own output failed: nothing more goes there, at exit neither
            fail(os_error_line(exc), ExitCode.LOCAL_IO)
        sys.exit(rv if isinstance(rv, int) else 0)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)  # --help and --version print here
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _ReaderGone from exc
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _ReaderGone from exc
            raise
        except UserError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (terminating)
            fail(terminating.word(), terminating.exit_code())

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:
            verbs = ", ".join(self.list_commands(ctx))
            raise _ShortUsage(f"usage: distrun COMMAND [OPTIONS]  (commands: {verbs})\n"
                              "'distrun --help' says what each does; 'distrun COMMAND --help' lists its options")
        if not args:  # completing the verb itself (distrun <TAB>)
            return super().parse_args(ctx, args)
        own = {o for p in self.params for o in getattr(p, "opts", [])} | set(ctx.help_option_names)
        verb = next((a for a in args if not a.startswith("-") and self.get_command(ctx, a) is not None), None)
        first = args[0]
        if first.startswith("-") and first.split("=", 1)[0] not in own and not ctx.resilient_parsing:
            command = self.get_command(ctx, verb) if verb is not None else None
            if verb is not None and command is not None and first.split("=", 1)[0] not in {
                    o for p in command.params for o in getattr(p, "opts", [])}:
                raise click.UsageError(f"no such option {first}{_suggest(first, sorted(own))} (distrun takes only "
                                       f"--help and --version before a command; 'distrun {verb} --help' lists "
                                       f"{verb}'s options)", ctx)
            if verb is not None:
                moved = " ".join(args[:args.index(verb)])
                raise click.UsageError(f"{first} is an option of '{verb}', not of distrun: put it after the verb "
                                       f"(distrun {verb} {moved} ...)", ctx)
            raise click.UsageError(f"{first} before any command: give a command first, its options after it "
                                   "(distrun COMMAND [OPTIONS]; 'distrun --help' lists the commands)", ctx)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            hint = _suggest(name.lower(), self.list_commands(ctx))
            raise click.UsageError(f"no such command {name!r}{hint} ('distrun --help' lists them)", ctx)
        return super().resolve_command(ctx, args)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Exit codes"):
            from distrun.launchers import exit_codes  # distrun's codes and each launcher's own

            formatter.write_dl([(str(code), meaning) for code, meaning in exit_codes()])


class Command(click.Command):
    """A verb that takes no positional argument it does not declare."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.allow_extra_args = True
        try:
            if not ctx.resilient_parsing:
                self.refuse_twice(ctx, args)
            rest = super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.ctx = exc.ctx or ctx  # click's parser leaves it out: the line then names the verb
            raise
        if ctx.args and not ctx.resilient_parsing:
            self.refuse_extra(ctx, ctx.args)
        return rest

    def refuse_twice(self, ctx: click.Context, args: list[str]) -> None:
        """An option that takes one value, given twice with two values (-i a ... -i b, --image x
        --image y): click would keep the last without a word; the two values are told instead."""
        once = {o: p for p in self.get_params(ctx) if isinstance(p, click.Option) and not p.multiple
                and not p.is_flag and not p.count for o in p.opts + p.secondary_opts}
        seen: dict[str, list[str]] = {}
        words = iter(args)
        for word in words:
            if word == "--":
                break
            name, eq, value = word.partition("=") if word.startswith("--") else (word[:2], "", word[2:])
            param = once.get(name)
            if param is None or not word.startswith("-"):
                continue
            if not eq and not value:
                value = next(words, "")
            seen.setdefault(max(param.opts, key=len), []).append(value)
        for flag, values in seen.items():
            if len(set(values)) > 1:  # the same value twice changes nothing
                shown = " and ".join(repr(v) for v in values)
                times = "twice" if len(values) == 2 else f"{len(values)} times"
                raise click.UsageError(f"{flag} is given {times} ({shown}); give it once", ctx)

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
