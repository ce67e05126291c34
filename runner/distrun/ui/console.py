"""Terminal output for the CLI: live per-host progress and summaries (the CLI owns all output)."""

from __future__ import annotations

import errno
import os
import time
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from distrun.printable import printable
from distrun.transport.playbook_events import HostProgress, PlaybookEvent, PlaybookResult


class _Rich(Console):
    """Rich's console, except that a reader that went away is an error distrun tells (exit 7), not
    Rich's own quiet exit 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain parts and (text, style) parts: nothing in it is ever read as markup or an
    emoji code, and each part is made printable first."""
    return Text.assemble(*((printable(p[0]), p[1]) if isinstance(p, tuple) else printable(p) for p in parts))


def _size(name: str, stderr: bool) -> int | None:
    """A COLUMNS or LINES that is no positive number (COLUMNS=0 from a script or a CI runner)
    would make Rich print nothing at all: the terminal's own size then, else 80 by 24."""
    text = os.environ.get(name)
    if text is None or (text.isdigit() and int(text) > 0):
        return None
    try:
        size = os.get_terminal_size(2 if stderr else 1)
    except OSError:
        size = os.terminal_size((0, 0))
    return (size.columns or 80) if name == "COLUMNS" else (size.lines or 24)


def _make(stderr: bool) -> Console:
    """A terminal gets colour, live tables and wrapping; a pipe, a file or a CI log gets plain
    lines that are never wrapped or cut, whatever COLUMNS says. Emoji codes are never read: a
    ':x:' in a job's line or an IPv6 address is text."""
    width, height = _size("COLUMNS", stderr), _size("LINES", stderr)
    console = _Rich(stderr=stderr, highlight=False, emoji=False, width=width, height=height)
    if console.is_terminal:
        return console
    return _Rich(stderr=stderr, highlight=False, emoji=False, soft_wrap=True, width=width, height=height)


class _Console:
    """The console the CLI prints on, made again by ``configure`` for each command from what its
    stream is then (a terminal or not); anything else is Rich's Console's."""

    def __init__(self, stderr: bool) -> None:
        self.stderr = stderr
        self._console: Console | None = None
        self.lost: OSError | None = None  # the stream's reader went away, or its disk is full

    def current(self) -> Console:
        if self._console is None:
            self._console = _make(self.stderr)
        return self._console

    def configure(self, stderr: bool) -> None:
        self._console = _make(stderr)
        self.lost = None

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Rich's print, each text first made printable (it may hold what a job printed). Where
        the stream is no terminal, text is written as it is, byte for byte (Rich would expand its
        tabs): markup, when the call has any, is only taken out. A reader that went away or a
        full disk silences the stream for the rest of the command (``lost`` says so), so a run
        that prints goes on to its end and its record; the CLI then exits 7."""
        out = self.current()
        try:
            if not out.is_terminal and all(isinstance(o, str | Text) for o in objects) and set(kwargs) <= _PLAIN_KWARGS:
                markup = kwargs.get("markup", True)
                # printable first: Rich's Text would drop a \r or a \x07 instead of showing it.
                texts = [o.plain if isinstance(o, Text) else
                         Text.from_markup(printable(o), emoji=False).plain if markup else printable(o) for o in objects]
                out.file.write(kwargs.get("sep", " ").join(texts) + kwargs.get("end", "\n"))
                out.file.flush()
                return
            out.print(*(printable(o) if isinstance(o, str) else o for o in objects), **kwargs)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self.lost = self.lost or exc
            out.quiet = True
            _to_devnull(2 if self.stderr else 1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current(), name)


# print's keywords that plain text honours as Rich would; any other goes through Rich.
_PLAIN_KWARGS = {"markup", "soft_wrap", "sep", "end", "highlight", "emoji", "crop", "overflow", "no_wrap"}
_GONE = (errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF)


def _to_devnull(fd: int) -> None:
    """The descriptor of a stream nothing more can be written to, pointed at /dev/null: a flush
    at exit then fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


console = _Console(stderr=False)
err_console = _Console(stderr=True)


def current_console(c: Console | _Console) -> Console:
    return c.current() if isinstance(c, _Console) else c


def configure(progress_to_stderr: bool = False) -> None:
    """Set both consoles up for this command; ``progress_to_stderr``: stdout is kept for one JSON
    object (``train --json``), so everything said as a run goes is said on stderr."""
    console.configure(stderr=progress_to_stderr)
    err_console.configure(stderr=True)


def print_table(columns: list[str], rows: list[list[str]], title: str | None = None, *, keep: tuple[int, ...] = (0,),
                drop: tuple[int, ...] | None = None, wrap: tuple[int, ...] = ()) -> None:
    """A table on a terminal; elsewhere one plain line per row, columns two spaces apart, no cell
    ever cut. Cells are text, never markup.

    On a terminal no cell is cut: the ``wrap`` columns wrap; when the terminal is too narrow for
    the rest, whole columns are dropped in the order ``drop`` gives (by default the last first),
    never one of ``keep``; when even those do not fit, the rows are printed as plain lines."""
    out = current_console(console)
    columns = [printable(c) for c in columns]
    rows = [[printable(c) for c in row] for row in rows]
    title = printable(title) if title else title
    if out.is_terminal:
        order = list(drop) if drop is not None else [i for i in reversed(range(len(columns))) if i not in keep]
        shown = list(range(len(columns)))
        while True:
            if _least_width(columns, rows, shown, wrap) <= out.width:
                console.print(_table(columns, rows, shown, wrap, title))
                return
            droppable = [i for i in order if i in shown and i not in keep]
            if not droppable:
                break
            shown.remove(droppable[0])
    if title:
        console.print(title, markup=False, soft_wrap=True)
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    for row in [columns, *rows]:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        console.print("  ".join([*padded, row[-1]]), markup=False, soft_wrap=True)


WRAP_MIN = 12  # a wrapping column narrower than this is dropped instead


def _least_width(columns: list[str], rows: list[list[str]], shown: list[int], wrap: tuple[int, ...]) -> int:
    """The narrowest the table can be with no cell cut: every column whole but the wrapping ones,
    one space of padding each side, a rule between two columns."""
    widths = [max(cell_len(r[i]) for r in [columns, *rows]) for i in shown]
    least = sum(min(w, WRAP_MIN) if i in wrap else w for i, w in zip(shown, widths, strict=True))
    return least + 2 * len(shown) + len(shown) - 1


def _table(columns: list[str], rows: list[list[str]], shown: list[int], wrap: tuple[int, ...], title: str | None) -> Table:
    table = Table(title=Text(title) if title else None, show_edge=False)
    for i in shown:
        whole = max(cell_len(r[i]) for r in [columns, *rows])
        if i in wrap:
            table.add_column(Text(columns[i]), overflow="fold", min_width=min(whole, WRAP_MIN))
        else:  # shown whole or not at all
            table.add_column(Text(columns[i]), no_wrap=True, overflow="ignore", min_width=whole)
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown))
    return table


class PlaybookProgress:
    """Live table on a terminal; one line per finished host task elsewhere (CI logs, pipes)."""

    def __init__(self, title: str, hosts: list[str]) -> None:
        self.title = title
        self.hosts = {h: HostProgress(h) for h in hosts}
        self.started = time.monotonic()
        self.live: Live | None = None
        self.interactive = current_console(console).is_terminal

    def __enter__(self) -> PlaybookProgress:
        console.print(styled((self.title, "bold")))
        if self.interactive:
            self.live = Live(self._table(), console=current_console(console), refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(None, None, None)

    def _table(self) -> Table:
        table = Table(show_edge=False, pad_edge=False)
        for col in ("host", "ok", "changed", "failed", "task"):
            table.add_column(col)
        for h in self.hosts.values():
            style = {"ok": "", "failed": "red", "unreachable": "red"}[h.state]
            table.add_row(styled(h.name), str(h.ok), str(h.changed), str(h.failed + int(h.unreachable)),
                          styled(printable(h.task)[:60]), style=style)
        return table

    def again(self, why: str) -> None:
        """The playbook runs again (``why``, printed): every host starts from nothing, so what
        the first run failed on is not shown as the second run's."""
        self.hosts = {h: HostProgress(h) for h in self.hosts}
        console.print(styled((why, "yellow")))
        if self.live is not None:
            self.live.update(self._table())

    def __call__(self, ev: PlaybookEvent) -> None:
        if ev.host is not None:
            h = self.hosts.setdefault(ev.host, HostProgress(ev.host))
            if ev.kind == "start":
                h.task = ev.task
            elif ev.kind in ("ok", "changed"):
                h.ok += 1
                h.changed += ev.kind == "changed"
            elif ev.kind == "failed":
                h.failed += 1
            elif ev.kind == "unreachable":
                h.unreachable = True
        if self.live is not None:
            self.live.update(self._table())
            return
        elapsed = time.monotonic() - self.started
        if ev.kind == "task":
            console.print(styled(f"  [{elapsed:6.1f}s] ", ev.task))
        elif ev.kind == "changed":
            console.print(styled("           changed: ", str(ev.host)))
        elif ev.kind in ("failed", "unreachable"):
            console.print(styled((f"           {ev.kind}: {ev.host}: {ev.message}", "red")))


def print_summary(result: PlaybookResult, elapsed: float) -> None:
    rows = [[h.name, str(h.ok), str(h.changed), str(h.failed), str(int(h.unreachable)), str(h.skipped)]
            for h in sorted(result.hosts.values(), key=lambda x: x.name)]
    print_table(["host", "ok", "changed", "failed", "unreachable", "skipped"], rows,
                title=f"{result.playbook}: {result.status} in {elapsed:.1f}s")
    # Parseable line: scripts and tests read it instead of the table.
    console.print(
        f"PLAY RECAP {result.playbook}: hosts={len(result.hosts)} changed={result.changed} "
        f"failed={sum(h.failed for h in result.hosts.values())} "
        f"unreachable={sum(int(h.unreachable) for h in result.hosts.values())} rc={result.rc}",
        markup=False, soft_wrap=True,
    )
    for h in result.failures():
        err_console.print(styled((f"{h.name}: {h.last_error}", "red")), soft_wrap=True)


def warn(message: str) -> None:
    """A yellow line on stderr; the text is never read as markup (it may come from a node)."""
    err_console.print(styled((message, "yellow")), soft_wrap=True)


def fatal(message: str) -> None:
    err_console.print(styled(("distrun: error:", "red"), " ", message), soft_wrap=True)
