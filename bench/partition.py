#!/usr/bin/env python3
"""Benchmark the partitioner on synthetic graphs: time, peak memory, edge cut, reuse.

    .venv/bin/python bench/partition.py                    # 1M, 10M, 114M edges; 2/4/8 parts; reuse
    .venv/bin/python bench/partition.py --sizes 1M 10M --json bench/results/partition.json

Each (size, parts, method) cell runs in a fresh child process (``--one``) so its peak resident
memory (getrusage ru_maxrss) belongs to that cell alone: the whole process, graph generation
included. The child generates the graph, then runs the same write_partition() that partition.py
runs (Metis, building and writing the parts one at a time, the manifest) into a temporary
folder. Metis k-way is measured at every size and part count, recursive bisection next to it at
4 and 8 parts. Reuse: partition.py is run once to write a partition, then timed as a whole
process (interpreter start to exit) five more times on the same inputs, where it only confirms
the partition. A cell that fails (out of memory, time limit) is reported as such. A benchmark,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, say, write_json  # noqa: E402

WORKLOADS = REPO / "workloads"
sys.path.insert(0, str(WORKLOADS))

# Edge counts are directed entries after symmetrising (Reddit: 114,615,892 over 232,965 nodes).
SIZES: dict[str, tuple[int, int]] = {
    "1M": (100_000, 1_000_000),
    "10M": (232_965, 10_000_000),
    "114M": (232_965, 114_615_892),
}
TARGET_S, TARGET_GIB, REUSE_TARGET_S = 10.0, 4.0, 0.2


def one(size: str, parts: int, method: str) -> None:
    import loaders
    import partition
    from datasets import METIS_MAX_EDGES, SyntheticSpec

    nodes, edges = SIZES[size]
    t0 = time.perf_counter()
    g = loaders.make_synthetic(SyntheticSpec(num_nodes=nodes, num_edges=edges, num_features=8, num_classes=41))
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-part-") as tmp:
        man = partition.write_partition(Path(tmp) / "out", g, parts, {"bench": size},
                                        metis=partition.metis_settings(method, METIS_MAX_EDGES))
    t2 = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    cell = {"size": size, "parts": parts, "method": method, "ok": True, "nodes": g.num_nodes, "edges": g.num_edges,
            "generate_s": t1 - t0, "partition_s": t2 - t1, "metis_s": man["metis_seconds"],
            "write_s": man["write_seconds"], "peak_rss_gib": rss_kib / 2**20, "edge_cut": man["edge_cut"],
            "cut_pct": 100.0 * man["edge_cut"] / (g.num_edges / 2), "balance": man["balance"],
            "metis_edges": man["metis"]["edges_seen"]}
    print(json.dumps(cell), flush=True)


def one_baseline(tree: str, size: str, parts: int) -> None:
    """The same cell with the partitioner of another revision (its own datasets and partition)."""
    sys.path.remove(str(WORKLOADS))
    sys.path.insert(0, f"{tree}/workloads")
    import datasets
    import partition

    nodes, edges = SIZES[size]
    t0 = time.perf_counter()
    g = datasets.make_synthetic(datasets.SyntheticSpec(num_nodes=nodes, num_edges=edges, num_features=8, num_classes=41))
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-part-") as tmp:
        man = partition.write_partition(Path(tmp) / "out", g, parts, {"bench": size})
    t2 = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"size": size, "parts": parts, "method": "baseline", "ok": True, "nodes": g.num_nodes,
                      "edges": g.num_edges, "generate_s": t1 - t0, "partition_s": t2 - t1, "metis_s": man["metis_seconds"],
                      "write_s": (t2 - t1) - man["metis_seconds"], "peak_rss_gib": rss_kib / 2**20,
                      "edge_cut": man["edge_cut"], "cut_pct": 100.0 * man["edge_cut"] / (g.num_edges / 2),
                      "balance": man["balance"], "metis_edges": g.num_edges}), flush=True)


def compare(rev: str, sizes: list[str], rounds: int, timeout: int) -> dict:
    """This partitioner and the one at git revision ``rev``, alternating, same sizes, 2 parts."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tree:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "workloads"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        pairs = []
        for size in sizes:
            for _ in range(rounds):
                old = run_cell(size, 2, "baseline", timeout, extra=["--tree", tree])
                new = run_cell(size, 2, "kway", timeout)
                say(f"compare {size}: now {new.get('partition_s', float('nan')):.1f} s {new.get('peak_rss_gib', float('nan')):.2f} GiB, "
                    f"{rev} {old.get('partition_s', float('nan')):.1f} s {old.get('peak_rss_gib', float('nan')):.2f} GiB")
                pairs.append({"now": new, "baseline": old})
    return {"rev": rev, "pairs": pairs}


def run_cell(size: str, parts: int, method: str, timeout: int, extra: list[str] | None = None) -> dict:
    cmd = [sys.executable, __file__, "--one", size, str(parts), method, *(extra or [])]
    base = {"size": size, "parts": parts, "method": method, "ok": False}
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"over the {timeout} s limit", "load": load}
    if proc.returncode != 0:
        why = "killed (out of memory?)" if proc.returncode < 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {**base, "error": f"exit {proc.returncode}: {why}", "load": load}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": load}


def reuse(label: str, args: list[str], repeats: int = 5) -> dict:
    """Write a partition with partition.py, then time the reuse runs as whole processes."""
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        cmd = [sys.executable, str(WORKLOADS / "partition.py"), *args, "--out", f"{tmp}/p"]
        env = dict(os.environ, DISTRUN_CACHE_DIR=f"{tmp}/cache")
        first = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if first.returncode != 0:
            return {"label": label, "ok": False, "error": first.stderr.strip()[-300:]}
        walls, outputs = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            walls.append(time.perf_counter() - t0)
            outputs.append(proc.stdout.strip())
        reused = all("reusing existing partition" in o for o in outputs)
        man = json.loads(Path(f"{tmp}/p/manifest.json").read_text())
        sizes = sum(f["bytes"] for f in man["files"].values())
    row = {"label": label, "ok": reused, "median_s": statistics.median(walls), "runs_s": walls,
           "parts_bytes": sizes, "load": os.getloadavg()[0]}
    say(f"reuse {label}: median {row['median_s']:.3f} s over {repeats} runs ({', '.join(f'{w:.3f}' for w in walls)}), "
        f"partition files {sizes / 2**20:.0f} MiB, reused={reused}")
    return row


def python_start_s(repeats: int = 5) -> float:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def render(data: dict | None, plot_rel: str | None = None) -> list[str]:
    """The partition section of docs/benchmarks.md."""
    out = ["## Partition (Metis via pymetis)", ""]
    if not data:
        return out + ["Not measured in this run.", ""]
    m = data["machine"]
    out += [f"Measured by `bench/partition.py` on {m['cpus']} cores, {m['mem_gib']} GiB RAM, Python {m['python']}, "
            f"{m['date_utc']}; 1-min load average {m['load_1min_at_start']} at the start (each row gives the load when "
            "its cell started: other work on the machine slows a cell down, it never speeds one up). Partition time "
            "covers Metis, building and writing the parts one at a time and the manifest; peak RSS is the whole "
            "process, graph generation included (8 features per node). Above 24M directed edges Metis sees a "
            "uniform sample of 24M of them (`--metis-max-edges`: its memory grows with the edges it sees, about 50 "
            "bytes per entry); the edge cut is always counted on the whole graph.", "",
            "| edges | nodes | parts | Metis | generate s | partition s | of which Metis s | write s | peak RSS GiB | "
            "edges Metis saw | edge cut | cut % | balance | load |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in data["cells"]:
        if c["ok"]:
            out.append(f"| {c['edges']:,} | {c['nodes']:,} | {c['parts']} | {c['method']} | {c['generate_s']:.1f} | "
                       f"{c['partition_s']:.1f} | {c['metis_s']:.1f} | {c['write_s']:.1f} | {c['peak_rss_gib']:.2f} | "
                       f"{c['metis_edges']:,} | {c['edge_cut']:,} | {c['cut_pct']:.1f} | {c['balance']:.3f} | {c['load']:.1f} |")
        else:
            nodes, edges = SIZES[c["size"]]
            out.append(f"| {edges:,} | {nodes:,} | {c['parts']} | {c['method']} | — | — | — | — | — | — | — | — | "
                       f"not measured: {c['error']} | {c['load']:.1f} |")
    big = next((c for c in data["cells"] if c["ok"] and c["size"] == "114M" and c["parts"] == 2 and c["method"] == "kway"), None)
    if big:
        met = big["partition_s"] <= TARGET_S and big["peak_rss_gib"] <= TARGET_GIB
        out += ["", f"**Target** (Reddit size, 114M edges, 2 parts: partition ≤ {TARGET_S:.0f} s, peak RSS ≤ "
                f"{TARGET_GIB:.0f} GiB; before this format 12.4 s and 7.51 GiB): {big['partition_s']:.1f} s, "
                f"{big['peak_rss_gib']:.2f} GiB at load {big['load']:.1f} — "
                f"**{'met' if met else 'not met'}**."]
    pairs = []
    for c in data["cells"]:
        if c["ok"] and c["method"] == "recursive":
            k = next((d for d in data["cells"] if d["ok"] and d["method"] == "kway" and d["size"] == c["size"]
                      and d["parts"] == c["parts"]), None)
            if k:
                pairs.append((c, k))
    if pairs:
        out += ["", "k-way against recursive bisection (same graph, same parts; pymetis' own default is recursive "
                "bisection up to 8 parts):", "",
                "| edges | parts | Metis s k-way / recursive | edge cut k-way / recursive | balance k-way / recursive |",
                "|---:|---:|---|---|---|"]
        for r, k in pairs:
            out.append(f"| {k['edges']:,} | {k['parts']} | {k['metis_s']:.1f} / {r['metis_s']:.1f} | "
                       f"{k['edge_cut']:,} / {r['edge_cut']:,} | {k['balance']:.3f} / {r['balance']:.3f} |")
    if data.get("reuse"):
        out += ["", f"Reusing an existing partition: `partition.py` with the same inputs, timed as a whole process "
                f"(Python start-up included: {data['python_start_s'] * 1000:.0f} ms for `python -c pass` here). "
                "The decision uses the dataset's spec or its files' memoised digests and one stat per part file; "
                "numpy is never imported.", "",
                "| dataset | partition files MiB | reuse s (median of 5) | runs s | load | target ≤ 0.2 s |",
                "|---|---:|---:|---|---:|---|"]
        for r in data["reuse"]:
            if not r.get("ok"):
                out.append(f"| {r['label']} | — | — | — | — | not measured: {r.get('error', 'not reused')} |")
                continue
            out.append(f"| {r['label']} | {r['parts_bytes'] / 2**20:.0f} | {r['median_s']:.3f} | "
                       f"{', '.join(f'{w:.3f}' for w in r['runs_s'])} | {r['load']:.1f} | "
                       f"{'met' if r['median_s'] <= REUSE_TARGET_S else 'not met'} |")
    cmp_ = data.get("comparison")
    if cmp_ and cmp_.get("pairs"):
        out += ["", "The previous partitioner (format 1: a stable argsort of every edge by owner, int64 indices, every "
                "part built before any was written, Metis on the whole graph) against this one, run alternately on "
                "the same graph under the same load, 2 parts (`bench/partition.py --baseline REV`):", "",
                "| edges | previous: partition s / peak RSS GiB | now: partition s / peak RSS GiB | now / previous time | load |",
                "|---:|---|---|---:|---:|"]
        for pr in cmp_["pairs"]:
            o, n = pr["baseline"], pr["now"]
            if o.get("ok") and n.get("ok"):
                out.append(f"| {n['edges']:,} | {o['partition_s']:.1f} / {o['peak_rss_gib']:.2f} | "
                           f"{n['partition_s']:.1f} / {n['peak_rss_gib']:.2f} | {n['partition_s'] / o['partition_s']:.2f} | "
                           f"{n['load']:.1f} |")
            else:
                out.append(f"| {SIZES[n['size']][1]:,} | {o.get('error', 'ok')} | {n.get('error', 'ok')} | — | {n['load']:.1f} |")
    if plot_rel:
        out += ["", f"![Partition time and peak memory against graph size]({plot_rel})"]
    out.append("")
    return out


def plot(data: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cells = [c for c in data["cells"] if c["ok"] and c["method"] == "kway"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for parts in sorted({c["parts"] for c in cells}):
        row = sorted((c for c in cells if c["parts"] == parts), key=lambda c: c["edges"])
        xs = [c["edges"] / 1e6 for c in row]
        ax1.plot(xs, [c["partition_s"] for c in row], marker="o", label=f"{parts} parts")
        ax2.plot(xs, [c["peak_rss_gib"] for c in row], marker="o", label=f"{parts} parts")
    ax1.axhline(TARGET_S, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET_S:.0f} s (2 parts)")
    ax2.axhline(TARGET_GIB, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET_GIB:.0f} GiB")
    for ax, title, unit in ((ax1, "partition time", "s"), (ax2, "peak RSS (generation included)", "GiB")):
        ax.set_xscale("log")
        ax.set_xlabel("directed edges (millions)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--no-recursive", action="store_true", help="skip the recursive-bisection cells")
    ap.add_argument("--no-reuse", action="store_true", help="skip the reuse timings")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "partition.json")
    ap.add_argument("--cora", type=Path, default=REPO.parent / "shared" / "datasets" / "cora",
                    help="Cora's Planetoid files, for the reuse timing")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="instead: time this partitioner against the one at git revision REV, alternating, at "
                         "--sizes with 2 parts, and add the pairs to the existing --json")
    ap.add_argument("--rounds", type=int, default=2, help="with --baseline: pairs per size")
    ap.add_argument("--one", nargs=3, metavar=("SIZE", "PARTS", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        if args.one[2] == "baseline":
            one_baseline(args.tree, args.one[0], int(args.one[1]))
        else:
            one(args.one[0], int(args.one[1]), args.one[2])
        return 0
    if args.baseline:
        data = json.loads(args.json.read_text()) if args.json.exists() else {"machine": machine(), "cells": [], "reuse": []}
        data["comparison"] = compare(args.baseline, args.sizes, args.rounds, args.timeout)
        write_json(args.json, data)
        say("\n".join(render(data)))
        return 0
    data: dict = {"machine": machine(), "cells": [], "reuse": []}
    for size in args.sizes:
        for parts in args.parts:
            methods = ["kway"] + (["recursive"] if parts >= 4 and not args.no_recursive else [])
            for method in methods:
                cell = run_cell(size, parts, method, args.timeout)
                say(json.dumps(cell))
                data["cells"].append(cell)
    if not args.no_reuse:
        data["python_start_s"] = python_start_s()
        if (args.cora / "raw" / "ind.cora.x").is_file() or (args.cora / "ind.cora.x").is_file():
            data["reuse"].append(reuse("Cora (2,708 nodes)", ["--dataset", "cora", "--data-dir", str(args.cora), "--num-parts", "2"]))
        for size in [s for s in args.sizes if s != "1M"]:
            nodes, edges = SIZES[size]
            data["reuse"].append(reuse(f"synthetic {size} edges", ["--dataset", "synthetic", "--syn-nodes", str(nodes),
                                                                     "--syn-edges", str(edges), "--syn-features", "8",
                                                                     "--syn-classes", "41", "--num-parts", "2"]))
    write_json(args.json, data)
    say("\n".join(render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
