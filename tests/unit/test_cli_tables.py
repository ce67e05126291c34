"""The terminal tables at widths from 40 to 200 columns: a run id or a status is never cut; the
summary wraps; columns that do not fit are dropped whole, in the stated order; where even the
run id and the status do not fit side by side, the rows come as plain lines (the terminal wraps
them, nothing is cut)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from distrun.ui import console as ui
from distrun.ui.records import print_runs

STATES = ["succeeded", "running (live)", "failed", "stopped", "lost", "unreachable"]
RUNS: list[dict[str, Any]] = [dict(run_id=f"20261123-00101{i}-{verb}-46{i:02d}", verb=verb, status=state, rc=None if i % 3 else i,
             duration_s=12.5 * i, inventory=f"/home/someone/projects/graph/inventory/prod{i}",
             summary="failed rc=1; first failing rank 1 on w2: ModuleNotFoundError: No module named 'torch'")
        for i, (state, verb) in enumerate(zip(STATES, ["train", "setup", "train", "train", "check", "train"], strict=True))]
DROP_ORDER = ["inventory", "duration", "verb", "rc", "summary"]


def render(width: int) -> str:
    buf = io.StringIO()
    ui.console._console = Console(file=buf, width=width, force_terminal=True, color_system=None,  # noqa: SLF001
                                  highlight=False)
    try:
        print_runs({"runs": RUNS})
    finally:
        ui.configure()
    return buf.getvalue()


@pytest.mark.parametrize("width", [40, 44, 50, 60, 70, 80, 90, 100, 120, 140, 160, 180, 200])
def test_no_run_id_or_status_is_ever_cut(width):
    out = render(width)
    lines = out.splitlines()
    for r in RUNS:
        row = next((ln for ln in lines if r["run_id"] in ln), None)
        assert row is not None, f"run id {r['run_id']} cut or missing at {width} columns:\n{out}"
        assert r["status"] in row, f"status {r['status']!r} cut at {width} columns:\n{out}"
    assert "…" not in out
    header = lines[0]
    if "┃" in header:  # a table: it fits the terminal, and what was dropped went in the stated order
        assert all(len(ln) <= width for ln in lines), out
        dropped = [c for c in DROP_ORDER if f" {c} " not in header]
        assert dropped == DROP_ORDER[:len(dropped)], f"dropped {dropped} at {width} columns"
    else:  # too narrow even for run and status side by side: plain lines, every column whole
        assert width < 46 and all(r["inventory"] in out for r in RUNS)


def test_wide_terminal_shows_every_column_and_the_whole_summary():
    out = render(200)
    header = out.splitlines()[0]
    for column in ["run", "verb", "status", "rc", "duration", "inventory", "summary"]:
        assert f" {column} " in header or header.rstrip().endswith(f" {column}")
    assert "ModuleNotFoundError" in out and "'torch'" in out  # wrapped, not cut
