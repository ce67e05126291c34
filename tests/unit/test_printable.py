"""Everything a job prints is data: escape sequences a job writes (clipboard writes, screen clears,
concealment, cursor moves, 8-bit forms) never reach the terminal through train's view, 'runs',
'show' or 'logs'; ordinary text and UTF-8 come through as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.printable import Stream, printable
from distrun.store.runs import new_run
from distrun.ui import console as ui

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # put 'rm -rf ~' on the clipboard
HOSTILE = {
    "clipboard (OSC 52, BEL)": OSC52,
    "clipboard (OSC 52, ST)": "\x1b]52;c;cm0gLXJmIH4K\x1b\\",
    "window title": "\x1b]0;owned\x07",
    "hyperlink": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "screen clear": "\x1b[2J\x1b[H",
    "concealment": "\x1b[8msecret\x1b[28m",
    "colour": "\x1b[1;31mred\x1b[0m",
    "cursor up and erase line": "\x1b[1A\x1b[2K",
    "terminal reset": "\x1bc",
    "charset switch": "\x1b(0",
    "DCS": "\x1bP+q544e\x1b\\",
    "APC": "\x1b_payload\x1b\\",
    "8-bit CSI": "\x9b2J",
    "8-bit OSC": "\x9d52;c;eA==\x9c",
    "bell and backspace": "\x07\x08\x08",
    "bidi override": "\u202etxt.exe",
    "lone carriage return": "100%\rfake line",
}
ESCAPES = ("\x1b", "\x9b", "\x9d", "\x9c", "\x07", "\x08", "\u202e")
UTF8 = "épochs ✓ 日本語 — naïve\ttab"


def clean(text: str) -> bool:
    return not any(e in text for e in ESCAPES)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_escape_is_removed_or_shown_escaped(name):
    out = printable(f"before {HOSTILE[name]} after")
    assert clean(out), repr(out)
    assert out.startswith("before ") and out.endswith(" after") or "after" in out


def test_ordinary_text_and_utf8_are_untouched():
    assert printable(UTF8) == UTF8
    assert printable("two\nlines\n") == "two\nlines\n"
    assert printable("crlf\r\nline") == "crlf\nline"


def test_what_is_shown_escaped_is_readable():
    assert printable("a\x07b") == "a\\x07b"
    assert printable("\u202etxt") == "\\u202etxt"
    assert printable("\x1b[8msecret\x1b[28m") == "secret"  # concealment gone, the text shown


def test_a_sequence_cut_between_two_pieces_is_removed_whole():
    stream = Stream()
    pieces = ["line one\n\x1b]52;c;cm0g", "LXJmIH4K\x07line two\x1b[", "2J\n", "end\r", "\nlast\x1b"]
    out = "".join(stream.feed(p) for p in pieces) + stream.end()
    assert clean(out), repr(out)
    assert out == "line one\nline two\nend\nlast\\x1b"  # a lone ESC at the very end: shown, escaped


def _hostile_run(tmp: Path) -> str:
    run = new_run("train", tmp / "hosts.ini")
    (run.dir / "launcher.log").write_text("".join(f"{name}: {seq}\n" for name, seq in HOSTILE.items()) + UTF8 + "\n")
    run.finish(1, "failed rc=1; " + OSC52 + "\x1b[2J" + "\x9b8m hidden")
    return run.id


@pytest.mark.parametrize("args", [["runs"], ["show", "last"], ["logs", "last"], ["show"]])
def test_runs_show_and_logs_show_a_hostile_run_as_data(private_state, tmp_path, args, monkeypatch):
    run_id = _hostile_run(tmp_path)
    result = CliRunner().invoke(main, args, prog_name="distrun", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert clean(result.output), repr(result.output)
    assert run_id[-8:] in result.output or args[0] == "logs"
    if args[0] == "logs":
        assert UTF8 in result.output and "screen clear: \n" in result.output
    else:
        assert "failed rc=1" in result.output


def test_train_view_prints_a_rank_line_as_data(capsys):
    from distrun.ui.run import TrainView

    ui.configure()
    view = TrainView()
    for name, seq in HOSTILE.items():
        view.line(f"rank 0: {name} {seq} done")
    view.line("DISTRUN_RESULT {\"test_acc\": 0.8}")
    out = capsys.readouterr().out
    assert clean(out), repr(out)
    assert out.count(" done") == len(HOSTILE) and 'DISTRUN_RESULT {"test_acc": 0.8}' in out


def test_warnings_and_errors_show_node_text_as_data(capsys):
    ui.configure()
    ui.warn(f"w2 said: {OSC52}")
    ui.fatal("w2: \x1b[2Jgone")
    err = capsys.readouterr().err
    assert clean(err) and "w2 said:" in err and "gone" in err
