#!/usr/bin/env python3
"""The suite's closing report: one table of layers (unit, docs/lint, workloads, molecule, quickstart,
cluster) merged from the pytest runs scripts/test started, the launcher x shared folder x
inventory matrix, then one closing line.

    python tests/harness/suite_report.py REPORT_DIR [PREP]

Each pytest run writes ``layers-<pid>.json`` into REPORT_DIR (tests/conftest.py) and each matrix
cell a row of ``matrix-<pid>.jsonl`` (tests/harness/matrix.py); PREP is "name=seconds,..." for
the steps scripts/test timed before pytest (bootstrap, node image). ``cpu.log`` (scripts/test
samples the first line of /proc/stat every few seconds, after the epoch time) gives how busy the
machine's CPUs were while the two pytest streams overlapped and after, when the cluster ran alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root makes tests.harness importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.matrix import read_rows, table  # noqa: E402


def layer_table(rows: list[dict], prep: str = "") -> list[str]:
    """The table's lines: the timed preparation steps, then one row per layer. "test s" adds up
    the tests' own durations; "wall s" spans a layer's first start to its last end (layers that
    run in parallel overlap)."""
    out = [f"{'layer':<18}{'tests':>6}{'passed':>8}{'failed':>8}{'skipped':>8}{'test s':>9}{'wall s':>9}"]
    for item in filter(None, prep.split(",")):
        name, _, secs = item.partition("=")
        out.append(f"{name:<18}{'':>6}{'':>8}{'':>8}{'':>8}{'':>9}{secs:>9}")
    for r in rows:
        out.append(f"{r['layer']:<18}{r['tests']:>6}{r['passed']:>8}{r['failed']:>8}{r['skipped']:>8}"
                   f"{r['test_s']:>9.0f}{r['stop'] - r['start']:>9.0f}")
    return out


def cpu_busy(samples: list[tuple[float, list[int]]], start: float, stop: float) -> float | None:
    """The share of CPU time not idle (nor waiting on I/O) between start and stop, from cumulative
    /proc/stat counters sampled at the times given; None when fewer than two samples fall inside."""
    inside = [s for s in samples if start <= s[0] <= stop]
    if len(inside) < 2:
        return None
    first, last = inside[0][1], inside[-1][1]
    total = sum(last) - sum(first)
    idle = (last[3] - first[3]) + (last[4] - first[4] if len(last) > 4 else 0)
    return (total - idle) / total if total > 0 else None


def read_cpu_log(path: Path) -> list[tuple[float, list[int]]]:
    samples = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        words = line.split()
        if len(words) > 5 and words[1] == "cpu" and all(w.isdigit() for w in words[2:]):
            samples.append((float(words[0]), [int(w) for w in words[2:]]))
    return samples


def cpu_lines(samples: list[tuple[float, list[int]]], rows: list[dict]) -> list[str]:
    """How busy the CPUs were while the streams overlapped (until the last layer other than the
    cluster's ended) and after it."""
    if not samples or not rows:
        return []
    others = [r["stop"] for r in rows if not r["layer"].startswith("cluster")]
    cluster = [r for r in rows if r["layer"].startswith("cluster")]
    begin, end = samples[0][0], samples[-1][0]
    split = max(others) if others and cluster else end
    parts = []
    for label, a, b in (("both streams", begin, split), ("the cluster alone", split, end)):
        busy = cpu_busy(samples, a, b)
        if busy is not None and b - a >= 30:
            parts.append(f"{busy:.0%} over {b - a:.0f} s with {label}")
    return [f"CPU busy: {'; '.join(parts)}"] if parts else []


def merge(runs: list[list[dict]]) -> list[dict]:
    merged: dict[str, dict] = {}
    for rows in runs:
        for r in rows:
            m = merged.setdefault(r["layer"], {**r, "tests": 0, "passed": 0, "failed": 0, "skipped": 0, "test_s": 0.0})
            for key in ("tests", "passed", "failed", "skipped", "test_s"):
                m[key] += r[key]
            m["start"], m["stop"] = min(m["start"], r["start"]), max(m["stop"], r["stop"])
    return list(merged.values())


def main(argv: list[str]) -> int:
    report_dir = Path(argv[0])
    prep = argv[1] if len(argv) > 1 else ""
    runs = [json.loads(f.read_text()) for f in sorted(report_dir.glob("layers-*.json"))]
    rows = merge(runs)
    print("=" * 30 + " the whole suite, per layer " + "=" * 30)
    for line in layer_table(rows, prep):
        print(line)
    for line in cpu_lines(read_cpu_log(report_dir / "cpu.log"), rows):
        print(line)
    cells = read_rows(report_dir)
    if cells:
        print("=" * 24 + " launcher x shared folder x inventory " + "=" * 24)
        for line in table(cells):
            print(line)
        print(f"cells: {len(cells)}, {sum(c['seconds'] for c in cells):.0f}s in all")
    for step in read_rows(report_dir, "steps"):
        print(f"{step['seconds']:>7.0f}s  {step['step']}")
    total = {k: sum(r[k] for r in rows) for k in ("passed", "failed", "skipped")}
    print(f"scripts/test: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
