#!/usr/bin/env python3
"""GDC (graph diffusion convolution): time and peak memory of the approximate PPR diffusion at
1M and 10M edges, and Cora's test accuracy with GDC next to without.

    .venv/bin/python bench/gdc.py [--sizes 1M 10M] [--seeds 0 1 2] [--json OUT]

Each size runs in a fresh child process (``--one``) so its peak RSS (getrusage, the process and
its forked workers apart) belongs to that size alone; the diffusion uses one worker per core, as
partition.py does. Accuracy: workloads/gcn_torch.py at 2 ranks on Cora (mpirun, 200 epochs,
Kipf & Welling's hyperparameters), on the graph and on its diffusion (alpha 0.05, top-128), one
run per seed; test accuracy at the last epoch. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, run, say, write_json  # noqa: E402

WORKLOADS = REPO / "workloads"
SIZES = {"1M": (100_000, 1_000_000), "10M": (232_965, 10_000_000)}
RESULT = re.compile(r"DISTRUN_RESULT (\{.*\})")


def one(size: str) -> None:
    sys.path.insert(0, str(WORKLOADS))
    import gdc
    import loaders
    from datasets import GdcSpec, SyntheticSpec

    nodes, edges = SIZES[size]
    g = loaders.make_synthetic(SyntheticSpec(num_nodes=nodes, num_edges=edges, num_features=8, num_classes=41))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    d = gdc.diffuse(g.indptr, g.indices, GdcSpec(), workers=os.cpu_count() or 1)
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"size": size, "ok": True, "nodes": g.num_nodes, "edges": g.num_edges, "seconds": wall,
                      "cpu_s": kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime,
                      "workers": os.cpu_count() or 1, "entries": d.nnz, "pushes": d.pushes, "rounds": d.rounds,
                      "peak_rss_gib": me.ru_maxrss / 2**20, "graph_rss_gib": before / 2**20,
                      "worker_peak_rss_gib": kids.ru_maxrss / 2**20}), flush=True)


def run_size(size: str, timeout: int) -> dict:
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"size": size, "ok": False, "error": f"over the {timeout} s limit", "load": load}
    if proc.returncode != 0:
        return {"size": size, "ok": False, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1], "load": load}
    row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": load, "load_end": os.getloadavg()[0]}
    say(f"gdc {size}: {row['seconds']:.1f} s ({row['cpu_s']:.0f} CPU s over {row['workers']} workers), "
        f"{row['entries']:,} entries, peak RSS {row['peak_rss_gib']:.2f} GiB (workers {row['worker_peak_rss_gib']:.2f} GiB), "
        f"load {load:.1f} -> {row['load_end']:.1f}")
    return row


def accuracy(cora: Path, seeds: list[int]) -> dict:
    out: dict = {"plain": [], "gdc": [], "partition_s": {}}
    with tempfile.TemporaryDirectory(prefix="bench-gdc-") as d:
        env = dict(os.environ, DISTRUN_CACHE_DIR=f"{d}/cache", OMP_NUM_THREADS="1")
        env.pop("DISTRUN_RUN_DIR", None)
        for name, extra in (("plain", []), ("gdc", ["--use-gdc"])):
            part = f"{d}/{name}"
            proc, wall = run([sys.executable, str(WORKLOADS / "partition.py"), "--dataset", "cora", "--data-dir", str(cora),
                              "--num-parts", "2", "--out", part, *extra], env=env)
            if proc.returncode != 0:
                return {"error": proc.stderr.strip()[-300:]}
            out["partition_s"][name] = wall
            for seed in seeds:
                cmd = ["mpirun", "-np", "2", "--allow-run-as-root", "--bind-to", "core", "-x", "OMP_NUM_THREADS",
                       "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={29800 + seed}",
                       sys.executable, str(WORKLOADS / "gcn_torch.py"), "--dataset", "cora", "--num-parts", "2",
                       "--part-dir", part, "--seed", str(seed), *extra]
                proc, _ = run(cmd, env=env)
                res = RESULT.findall(proc.stdout)
                acc = json.loads(res[-1])["test_acc"] if res else None
                out[name].append(acc)
                say(f"gdc cora {name} seed {seed}: test accuracy {acc}")
    return out


def render(data: dict | None) -> list[str]:
    out = ["## GDC: the diffusion's cost, and Cora with and without it", ""]
    if not data:
        return out + ["Not measured in this run.", ""]
    m = data["machine"]
    out += [f"`bench/gdc.py` on {m['cpus']} cores, {m['date_utc']}. The approximate personalized-PageRank "
            "diffusion of `workloads/gdc.py` (alpha 0.05, top-128 per node, push precision 1e-4, one forked worker "
            "per core) on the synthetic graphs of the partition benchmark; time is the diffusion alone, after the "
            "graph is generated. Peak RSS: the main process (graph, result) and the largest worker (its own "
            "N x 64 scratch arrays).", "",
            "| edges | nodes | diffusion s | CPU s (all workers) | entries kept | pushes | peak RSS GiB main / worker | load at start / end |",
            "|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in data["sizes"]:
        if not r.get("ok"):
            out.append(f"| {SIZES[r['size']][1]:,} | {SIZES[r['size']][0]:,} | not measured: {r.get('error')} | | | | | {r['load']:.1f} |")
            continue
        out.append(f"| {r['edges']:,} | {r['nodes']:,} | {r['seconds']:.1f} | {r['cpu_s']:.0f} | {r['entries']:,} | "
                   f"{r['pushes']:,} | {r['peak_rss_gib']:.2f} / {r['worker_peak_rss_gib']:.2f} | "
                   f"{r['load']:.1f} / {r['load_end']:.1f} |")
    acc = data.get("accuracy") or {}
    if acc.get("plain"):
        def fmt(xs: list) -> str:
            ok = [x for x in xs if x is not None]
            if not ok:
                return "failed"
            return f"{statistics.mean(ok):.3f} (" + ", ".join(f"{x:.3f}" for x in ok) + ")"
        out += ["", "Cora, `gcn_torch` at 2 ranks, 200 epochs, test accuracy at the last epoch, mean (per seed): "
                f"GCN on the graph {fmt(acc['plain'])}; GCN + GDC {fmt(acc['gdc'])}. "
                f"Partitioning Cora took {acc['partition_s'].get('plain', 0):.1f} s without and "
                f"{acc['partition_s'].get('gdc', 0):.1f} s with the diffusion (process wall time). "
                "Klicpera et al. report 83.6% for GCN + GDC on Cora with their own splits and tuning; this is "
                "the standard Planetoid split with Kipf & Welling's settings."]
        plain = [x for x in acc["plain"] if x is not None]
        diffused = [x for x in acc["gdc"] if x is not None]
        if plain and diffused:
            delta = 100 * (statistics.mean(diffused) - statistics.mean(plain))
            out.append(f"Difference of the means: {delta:+.1f} points for GDC.")
    out.append("")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--cora", type=Path, default=REPO.parent / "shared" / "datasets" / "cora")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "gdc.json")
    ap.add_argument("--one", metavar="SIZE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one)
        return 0
    data = {"machine": machine(), "sizes": [run_size(s, args.timeout) for s in args.sizes]}
    if args.seeds:
        data["accuracy"] = accuracy(args.cora, args.seeds)
    write_json(args.json, data)
    say("\n".join(render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
