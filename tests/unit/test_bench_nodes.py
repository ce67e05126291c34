"""The nodes benchmark's table: ratios against the smallest size, the slope, the linear model,
the false failures and the targets (bench/nodes_report.py, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.modules import load_file

report = load_file(Path(__file__).resolve().parents[2] / "bench" / "nodes_report.py")


def _size(n: int, check_s: float, train_s: float, failures: tuple[str, ...] = ()) -> dict:
    again = 2.0 + n / 20  # 2.15 at 3 nodes, 2.8 at 16
    return {"nodes": n, "check": [{"wall_s": check_s, "ok": not failures, "failures": list(failures), "json_bytes": 2048},
                                  {"wall_s": again, "ok": True, "failures": [], "json_bytes": 2048}],
            "train": [{"wall_s": train_s, "rc": 0, "record_bytes": 1024 * n}], "train_median_s": train_s,
            "collect_median_s": 0.2, "detach": {"rc": 0, "wall_s": 3.0}, "stop": {"rc": 0, "wall_s": 2.0}}


DATA = {"sizes": [3, 8, 16], "job_s": 1.0,
        "setup": [{"nodes": 3, "label": "first converge", "wall_s": 100.0, "rc": 0},
                  {"nodes": 16, "label": "first converge (first 3 converged)", "wall_s": 230.0, "rc": 0},
                  {"nodes": 3, "label": "re-run", "wall_s": 30.0, "rc": 0}],
        "rows": [_size(3, 3.0, 3.0), _size(8, 4.0, 3.5, ("ssh/w8: Connection reset",)), _size(16, 5.6, 4.3),
                 {"nodes": 32, "error": "RuntimeError: no"}]}


def test_a_straight_line_has_its_slope_and_a_single_size_has_none():
    assert report.slope([(3, 3.0), (8, 8.0), (16, 16.0)]) == pytest.approx(1.0)
    assert report.slope([(3, 3.0), (3, 4.0)]) is None


def test_each_figure_is_read_against_the_smallest_size_and_modelled_along_its_slope():
    rows = {r["figure"]: r for r in report.figures(DATA)}
    ovh = rows["launch overhead (train − 1 s)"]
    assert ovh["values"] == {3: 2.0, 8: 2.5, 16: 3.3}
    assert ovh["ratio"][16] == pytest.approx(1.65)
    first = rows["`setup` first converge"]
    assert first["slope"] == pytest.approx(10.0)  # (230 - 100) / 13
    assert first["model"][256] == pytest.approx(100 + 10 * 253)
    assert rows["`setup` re-run"]["slope"] is None  # measured at one size only


def test_only_check_and_the_launch_overhead_have_a_target_and_the_failures_are_listed():
    v = {fig: (round(r, 2), met) for fig, r, met in report.verdicts(report.figures(DATA))}
    assert v == {report.CHECK_FIRST: (1.87, False), report.CHECK_AGAIN: (1.3, True),
                 "launch overhead (train − 1 s)": (1.65, False)}
    assert report.false_failures(DATA) == ["8 nodes, run 1: ssh/w8: Connection reset"]


def test_the_section_renders_its_table_and_summary_rows():
    forks = {"nodes": 16, "forks": 8, "check": {"wall_s": 30.0, "rc": 1, "failures": ["net/w9: refused"]},
             "train": {"wall_s": 20.0, "rc": 3, "error": "x\ndistrun: error: preflight failed on w9"}}
    text = "\n".join(report.render({**DATA, "machine": {}, "fewer_forks": forks}))
    assert "`check` 30.00 s, rc 1, 1 failure(s) reported; `train` 20.00 s, rc 3." in text
    assert "- train: `distrun: error: preflight failed on w9`" in text
    assert "| launch overhead (train − 1 s) | 2.00 | 2.50 | 3.30 | 1.65x |" in text
    assert "### Projection to 256 and 1,024 nodes" in text
    assert [r.split(" | ")[0] for r in report.summary_rows(DATA)] == [
        "| check, first run: every node logs in to every other at 16 nodes",
        "| check again, nothing changed: sshd banners at 16 nodes", "| launch overhead (train − 1 s) at 16 nodes"]


def test_the_cpu_table_splits_the_machines_busy_time_into_the_controllers_and_the_nodes():
    data = {"sizes": [3], "rows": [{**_size(3, 4.0, 3.0), "check": [
        {"wall_s": 4.0, "ok": True, "cpu": {"machine_s": 6.0, "command_s": 1.5, "cores": 2}},
        {"wall_s": 2.0, "ok": True, "cpu": {"machine_s": 2.0, "command_s": 1.4, "cores": 2}}]}]}
    lines = report._cpu_lines(data)
    assert "| 3 | `check`, first run | 4.00 | 6.00 | 75% | 1.50 | 4.50 | 1.500 |" in lines
    assert "| 3 | `check` again | 2.00 | 2.00 | 50% | 1.40 | 0.60 | 0.200 |" in lines
    assert not any("`train" in ln for ln in lines)  # its runs measured no CPU
    assert report._cpu_lines(DATA) == []  # a run of the benchmark before it measured CPU


def test_the_cpu_reading_gives_the_controllers_cpu_added_per_node():
    def size(n: int, command_s: float) -> dict:
        return {**_size(n, 4.0, 3.0), "check": [
            {"wall_s": 4.0, "ok": True, "cpu": {"machine_s": 8.0, "command_s": command_s, "cores": 2}}]}
    text = "\n".join(report._cpu_lines({"sizes": [3, 13], "rows": [size(3, 2.0), size(13, 7.0)]}))
    assert "busy 100% (`check`, first run)" in text
    assert "`check`, first run 2.00 s at 3 nodes and 7.00 s at 13 (0.50 s per node added)" in text
