#!/usr/bin/env python3
"""Benchmark the Metis partitioner on synthetic graphs: time, peak memory, edge cut.

    .venv/bin/python bench/partition.py                    # 1M, 10M and 114M edges x 2/4/8 parts
    .venv/bin/python bench/partition.py --sizes 1M 10M     # a subset
    .venv/bin/python bench/partition.py --out docs/benchmarks-partition.md

Each (size, parts) cell runs in a fresh child process (``--one``) so its peak resident memory
(getrusage ru_maxrss) belongs to that cell alone. The child generates the graph, then runs the
same write_partition() that partition.py runs (Metis, building parts, writing the .npz files and
manifest into a temporary folder). A cell that fails (out of memory, time limit) is reported as
such in the table rather than dropped. This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workloads"))

# Edge counts are directed entries after symmetrising (Reddit: 114,615,892 over 232,965 nodes).
SIZES: dict[str, tuple[int, int]] = {
    "1M": (100_000, 1_000_000),
    "10M": (232_965, 10_000_000),
    "114M": (232_965, 114_615_892),
}


@dataclass
class Cell:
    size: str
    parts: int
    ok: bool
    nodes: int = 0
    edges: int = 0
    generate_s: float = 0.0
    partition_s: float = 0.0
    metis_s: float = 0.0
    peak_rss_gib: float = 0.0
    edge_cut: int = 0
    balance: float = 0.0
    error: str = ""


def one(size: str, parts: int) -> None:
    import datasets
    import partition

    nodes, edges = SIZES[size]
    t0 = time.perf_counter()
    g = datasets.make_synthetic(datasets.SyntheticSpec(num_nodes=nodes, num_edges=edges, num_features=8, num_classes=41))
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-part-") as tmp:
        man = partition.write_partition(Path(tmp) / "out", g, parts, {"bench": size})
    t2 = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    cell = Cell(size, parts, True, g.num_nodes, g.num_edges, t1 - t0, t2 - t1, man["metis_seconds"],
                rss_kib / 2**20, man["edge_cut"], man["balance"])
    print(json.dumps(cell.__dict__), flush=True)


def run_cell(size: str, parts: int, timeout: int) -> Cell:
    cmd = [sys.executable, __file__, "--one", size, str(parts)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Cell(size, parts, False, error=f"over the {timeout} s limit")
    if proc.returncode != 0:
        why = "killed (out of memory?)" if proc.returncode < 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return Cell(size, parts, False, error=f"exit {proc.returncode}: {why}")
    return Cell(**json.loads(proc.stdout.strip().splitlines()[-1]))


def table(cells: list[Cell]) -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        "## Partitioner (Metis via pymetis) on synthetic graphs",
        "",
        f"Measured by `bench/partition.py` on {os.cpu_count()} cores, {mem:.0f} GiB RAM, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d', time.gmtime())}. Partition time covers "
        "Metis, building the parts and writing the .npz files; peak RSS is the whole process, "
        "graph generation included (8 features per node).",
        "",
        "| edges | nodes | parts | generate s | partition s | of which Metis s | peak RSS GiB | edge cut | cut % | balance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        if c.ok:
            cut_pct = 100.0 * c.edge_cut / (c.edges / 2)
            lines.append(
                f"| {c.edges:,} | {c.nodes:,} | {c.parts} | {c.generate_s:.1f} | {c.partition_s:.1f} | {c.metis_s:.1f} | "
                f"{c.peak_rss_gib:.2f} | {c.edge_cut:,} | {cut_pct:.1f} | {c.balance:.3f} |"
            )
        else:
            nodes, edges = SIZES[c.size]
            lines.append(f"| {edges:,} | {nodes:,} | {c.parts} | — | — | — | — | — | — | not measured: {c.error} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-partition.md")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "PARTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one[0], int(args.one[1]))
        return 0
    cells = []
    for size in args.sizes:
        for parts in args.parts:
            cell = run_cell(size, parts, args.timeout)
            print(json.dumps(cell.__dict__), flush=True)
            cells.append(cell)
    text = table(cells)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
