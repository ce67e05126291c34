"""A job's output and a user's arguments come out of every printer as they were written: Rich's
emoji codes (':ok:', ':x:', an IPv6 address's ':a:'), its markup ('[bold]', '[/]', '\\[') and
anything else that looks like a format are text. Only printable()'s own change is allowed
(escape sequences removed, other control characters shown escaped).

Random texts from a seeded generator, each through every printer of ui/ (train's stream,
warnings, errors, tables, 'show', 'status', 'stop', 'check', a playbook's progress and recap, a
run's summary), to a pipe byte for byte and to a terminal character for character; then a user's
arguments through the command line's refusals."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from distrun.cli.main import main
from distrun.printable import printable
from distrun.run.diagnosis import RunSummary
from distrun.run.liveness import ClusterState
from distrun.run.reconcile import RunView
from distrun.run.stop import StopReport
from distrun.store.runs import Run, RunMeta
from distrun.transport.playbook_events import HostProgress, PlaybookEvent, PlaybookResult
from distrun.ui import console as ui
from distrun.ui import records, run
from distrun.ui.check import print_check_report

PIECES = [":ok:", ":x:", ":cd:", ":smile:", ":thumbs_up:", ":a:", ":b:", "2001:db8:a:b::1", "fe80::1:a:b%eth0", "::",
          ":", "[bold]", "[/bold]", "[red]", "[/]", "[link=https://x.example]", "[b]x[/b]", "\\[b]", "\\", "[", "]",
          "[[", "]]", "[@click]", "%s", "{0}", "{}", "$(id)", "`x`", "'", '"', " ", "  ", "é", "✓", "日本", "\t",
          "\x1b[31m", "\x1b]52;c;eA==\x07", "\x07", "\x00", "\u202e", "\r", "abc", "Zz9", "-", "=", "#", "*", "~"]
SEED = 63
TEXTS = 300


def texts(count: int = TEXTS, seed: int = SEED, newlines: bool = False, tabs: bool = True) -> list[str]:
    rng = random.Random(seed)
    out = []
    pieces = PIECES if tabs else [p for p in PIECES if p != "\t"]
    for _ in range(count):
        words = [rng.choice(pieces) for _ in range(rng.randint(1, 8))]
        if newlines and rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), "\n")
        text = "".join(words)
        text = text if newlines else text.replace("\r", "").replace("\n", "")
        out.append(text if text.strip() else text + "x")
    return out


def shown(text: str) -> str:
    return printable(text)


def _printers(t: str, pipe: bool) -> list[tuple[str, object, list[str]]]:
    """(name, call, the lines that call must print, as printable() makes them) for text ``t``; on
    a terminal, a table's cell is what must be there whole (its row is drawn with rules)."""
    meta = RunMeta(run_id="20261118-110640-train-a1b2", verb="train", inventory=t, started=1_795_000_000.0,
                   status="failed", rc=1, finished=1_795_000_010.0, summary=t)
    one_run = Run(Path("/tmp/x"), meta)
    view = run.TrainView()
    state = ClusterState("failed", world_size=1)
    summary = RunSummary("r1", 1, 1, 1.0, 1, Path("/tmp/logs"), 1, failure=f"; {t}", hints=[t])
    result = PlaybookResult("setup.yml", 2, "failed", {"w1": HostProgress("w1", failed=1, last_error=t)}, Path("/tmp"))
    progress = ui.PlaybookProgress(t, ["w1"])
    return [
        ("train's stream (a rank's line)", lambda: view.line(t), [t]),
        ("--prepare's stream", lambda: view.prepare_line(t), [f"  prepare| {t}"]),
        ("a warning", lambda: ui.warn(t), [t]),
        ("an error", lambda: ui.fatal(t), [f"distrun: error: {t}"]),
        ("a node that failed", lambda: view.node_failed(t), [f"{t}: stopping every rank on every node"]),
        ("a restart", lambda: view.restarting(1, 2, [t], t), [f"{t}: restart 1 of 2 on {t}"]),
        ("no restart", lambda: view.not_restarting(t), [f"not restarting: {t}"]),
        ("a run that ended", lambda: view.already_ended(one_run), [f"run {meta.run_id} already ended: failed ({t}); "
                                                                    f"'distrun logs {meta.run_id}' shows its output"]),
        ("a failed run's summary", lambda: view.finished(summary), [f"run r1 failed (launcher exit 1) after 1.0s; {t}",
                                                                    f"  hint: {t}"]),
        ("a table", lambda: ui.print_table(["run", "summary"], [["r1", t]], title=t), [t, "r1   " + t] if pipe else [t]),
        ("show", lambda: records.print_show({**_detail(t)}), [f"summary:    {t}", f"inventory:  {t}"]),
        ("status", lambda: run.print_status(RunView(one_run, "failed", t, False, state)), [f"  {t}"]),
        ("stop", lambda: run.print_stop_report(StopReport("r1", {t: 2}, {})), [f"  {t}: stopped 2 process(es)"]),
        ("stop, a node missed", lambda: run.print_stop_report(StopReport("r1", {}, {"w1": t})), [f"  w1: NOT stopped: {t}"]),
        ("check", lambda: print_check_report({"ok": False, "hosts": {"w1": {}}, "elapsed_s": 1.0, "checks": {
            "env": {"w1": {"ok": False, "detail": t, "fix": t}}}}), [f"✗ env on w1: {t}", f"    fix: {t}"]),
        ("a playbook's title", lambda: progress.__enter__(), [t]),
        ("a playbook's task", lambda: progress(PlaybookEvent("task", None, t)), [t]),
        ("a playbook's failure", lambda: progress(PlaybookEvent("failed", "w1", "x", message=t)), [f"failed: w1: {t}"]),
        ("a playbook's recap", lambda: ui.print_summary(result, 1.0), [f"w1: {t}"]),
    ]


def _detail(t: str) -> dict:
    return {"run_id": "r1", "verb": "train", "status": "failed", "rc": 1, "inventory": t, "started": None, "finished": None,
            "summary": t, "dir": "/tmp/x", "plan": None, "image": None, "result": None, "timings": None,
            "commands": {"partition": None, "launch": {}, "file": None},
            "logs": {"launcher": None, "ranks": {}, "ansible": None}}


def _printed(call, terminal: bool) -> str:
    out, err = io.StringIO(), io.StringIO()
    for c, buf in ((ui.console, out), (ui.err_console, err)):
        c._console = Console(file=buf, force_terminal=terminal, color_system=None, width=10_000,  # noqa: SLF001
                             highlight=False, emoji=False, soft_wrap=not terminal)
        c.lost = None
    try:
        call()
    finally:
        ui.configure()
    return out.getvalue() + err.getvalue()


@pytest.mark.parametrize("terminal", [False, True], ids=["a pipe", "a terminal"])
def test_every_printer_prints_a_jobs_and_a_users_text_as_it_was_written(terminal, monkeypatch):
    """Each printer's lines must appear whole in what it printed: to a pipe byte for byte (newlines
    and tabs too), to a terminal as its characters (texts without tabs there: Rich shows a tab as
    spaces to the next stop, which is the terminal's own way)."""
    problems = []
    for t in texts(newlines=not terminal, tabs=not terminal):
        for name, call, lines in _printers(t, pipe=not terminal):
            got = _printed(call, terminal)
            for line in lines:
                want = shown(line)
                if want not in got:
                    problems.append(f"{name}: {t!r}: wanted {want!r} in {got!r}")
    assert not problems, f"{len(problems)} texts changed:\n" + "\n".join(problems[:20])


def test_a_pipe_gets_exactly_the_line_and_nothing_else():
    for t in texts():
        assert _printed(lambda t=t: ui.console.print(t, markup=False, soft_wrap=True), False) == shown(t) + "\n"
        assert _printed(lambda t=t: ui.warn(t), False) == shown(t) + "\n"


def test_the_generator_makes_the_texts_that_broke_before():
    """The texts hold emoji codes Rich knows, markup it would read and IPv6 addresses."""
    from rich.emoji import Emoji

    made = "".join(texts())
    assert all(code in made for code in (":ok:", ":x:", ":cd:", "[bold]", "2001:db8:a:b::1", "\x1b[31m", "\t"))
    assert Emoji.replace(":ok: :x:") != ":ok: :x:"  # what Rich would have done to them


@pytest.mark.parametrize("verb", ["show", "logs", "stop", "status", "attach"])
def test_a_users_run_id_comes_back_as_typed(verb, private_state):
    for t in texts(count=60, seed=SEED + 1):
        t = t.replace("\x00", "")  # argv cannot hold NUL
        result = CliRunner().invoke(main, [verb, "--", t], prog_name="distrun", env={"COLUMNS": "80"})
        assert result.exit_code == 2, (t, result.output)
        assert printable(repr(t)) in result.stderr or printable(repr(t.strip())) in result.stderr, (t, result.stderr)


def test_a_users_option_values_come_back_as_typed(private_state, tmp_path):
    two = "tests/golden/inventories/two-nodes"
    for t in texts(count=40, seed=SEED + 2):
        t = t.replace("\x00", "")
        for argv, want in ((["train", "-i", two, "--dry-run", f"--launcher={t}"], repr(t)),
                           (["train", "-i", two, "--dry-run", f"--env={t.replace('=', '')}=1"], repr(t.replace("=", ""))),
                           (["init", "--head", "a", "--workers", "a", "--dir", str(tmp_path), "--", t], repr(t))):
            result = CliRunner().invoke(main, argv, prog_name="distrun", env={"COLUMNS": "80", "DISTRUN_INVENTORY": None})
            assert result.exit_code == 2, (argv, result.output)
            assert printable(want) in result.stderr, (argv, result.stderr)


