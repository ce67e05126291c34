#!/usr/bin/env python3
"""Strong scaling of the partitioned GCN workloads on two graph shapes: 1 rank x 1 thread, 1 rank x 2
threads, 2 ranks x 1 thread each pinned to its own core.

    .venv/bin/python bench/train.py [--quick] [--json OUT] [--workloads gcn_torch gcn_jittor]
        [--shapes narrow wide]

Both partitioned trainers (workloads/gcn_torch.py: torch sparse CSR products, halo exchange with
torch.distributed.all_to_all_single over gloo; workloads/gcn_jittor.py: numpy SpMM, halo exchange
with mpi4py Alltoallv) run under this machine's mpirun on the same synthetic graphs, each
partitioned once per part count beforehand. The shapes: "narrow" (features as wide as the hidden
layer: the first layer aggregates the input features first) and "wide" (twice the nodes, features
four times the hidden layer: the first layer transforms first and exchanges rows of X·W1). Binding:
`--bind-to core` for 1 x 1 and 2 x 1 (one core per rank, no oversubscription), `--bind-to none` for
1 x 2; threads through OMP_NUM_THREADS (and torch's --threads). Every configuration runs once
untimed first (Jittor compiles each op shape on its first run), then five times timed, in rounds
(each configuration once per round, so a slow spell on the machine does not fall on one
configuration only); a row is its fastest run (other work on this shared machine only slows a run
down; every run's figure is beside it, and the target line gives the ratio of the medians too). Epoch time is the training step (forward, backward,
gradient allreduce, update), mean of the epochs after the first; each rank reports the time it spent
in communication (halo exchanges; for torch also the gradient allreduce) and the bytes it sent per
epoch. The replicated DDP example (gcn_ddp) is not a scaling workload and is not measured here. A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine, run, say, write_json  # noqa: E402

RESULT = re.compile(r"DISTRUN_RESULT (\{.*\})")
# The graph shapes measured, each in its own table: the trainers take a different first-layer
# order on each (features no wider than the hidden layer: Â·X first; wider: X·W1 first).
SHAPES = {
    "narrow": {"nodes": 50_000, "edges": 1_000_000, "features": 64, "hidden": 64, "classes": 8, "epochs": 20},
    "wide": {"nodes": 100_000, "edges": 1_000_000, "features": 256, "hidden": 64, "classes": 8, "epochs": 10},
}
CONFIGS = [  # label, ranks, threads per rank, mpirun binding
    ("1 rank x 1 thread", 1, 1, "core"),
    ("1 rank x 2 threads", 1, 2, "none"),
    ("2 ranks x 1 thread", 2, 1, "core"),
]
TARGET = 1.7
REPEATS = 5  # timed runs per configuration, in rounds; a row is its fastest run


def graph_args(g: dict) -> list[str]:
    return ["--dataset", "synthetic", "--syn-nodes", str(g["nodes"]), "--syn-edges", str(g["edges"]),
            "--syn-features", str(g["features"]), "--syn-classes", str(g["classes"])]


def partition(root: Path, g: dict, parts: int) -> Path:
    out = root / f"p{parts}"
    proc, _ = run([sys.executable, str(REPO / "workloads" / "partition.py"), *graph_args(g), "--num-parts", str(parts),
                   "--out", str(out)], env=dict(os.environ, DISTRUN_CACHE_DIR=str(root / "cache")))
    if proc.returncode != 0:
        raise SystemExit(f"bench/train.py: partitioning failed: {proc.stderr.strip()[-500:]}")
    return out


def one(workload: str, shape: str, label: str, ranks: int, threads: int, bind: str, part: Path, epochs: int,
        port: int, warm_up: bool) -> dict:
    g = SHAPES[shape]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("DISTRUN_RUN_DIR", None)
    if workload == "gcn_jittor":
        sys.path.insert(0, str(REPO / "tests" / "workloads"))
        from jittor_cache import jittor_env

        env = jittor_env(env)
    cmd = ["mpirun", "-np", str(ranks), "--bind-to", bind, "--map-by", "core", "--allow-run-as-root",
           "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    for var in ("JITTOR_HOME", "nvcc_path", "use_mkl"):
        if var in env:
            cmd += ["-x", var]
    prog = [sys.executable, str(REPO / "workloads" / f"{workload}.py"), *graph_args(g), "--hidden", str(g["hidden"]),
            "--num-parts", str(ranks), "--part-dir", str(part)]
    if workload == "gcn_torch":
        prog += ["--threads", str(threads)]
    with tempfile.TemporaryDirectory(prefix="bench-train-") as d:
        # The untimed run (each configuration's first): Jittor compiles its kernels for these
        # shapes, the page cache holds the parts.
        warm_rc = run(cmd + prog + ["--epochs", "3", "--result-file", f"{d}/warm.json"], env=env, timeout=1800)[0].returncode \
            if warm_up else None
        proc, wall = run(cmd + prog + ["--epochs", str(epochs), "--result-file", f"{d}/r.json"], env=env, timeout=1800)
    load = os.getloadavg()[0]
    res = RESULT.findall(proc.stdout)
    row = {"workload": workload, "shape": shape, "label": label, "ranks": ranks, "threads": threads, "bind": bind,
           "rc": proc.returncode, "warm_rc": warm_rc, "wall_s": round(wall, 2), "load_1min": round(load, 2)}
    if proc.returncode != 0 or not res:
        row["error"] = (proc.stdout[-600:] + proc.stderr[-1200:]).strip()
        say(f"train {workload} {shape} {label}: failed rc={proc.returncode}")
        return row
    r = json.loads(res[-1])
    prof = r.get("ranks_profile") or []
    row.update(epoch_s=max(p["epoch_s"] for p in prof), first_epoch_s=r["first_epoch_time_s"], test_acc=r["test_acc"],
               ranks_profile=prof, edge_cut=r.get("edge_cut"))
    say(f"train {workload} {shape} {label}: {row['epoch_s']:.4f} s/epoch (first {row['first_epoch_s']:.3f} s), "
        + ", ".join(f"rank {p['rank']}: compute {p['compute_s']:.4f} s comm {p['comm_s']:.4f} s "
                    f"halo {p['halo_bytes'] / 2**20:.2f} MiB allreduce {p['allreduce_bytes'] / 1024:.1f} KiB" for p in prof)
        + f", load {load:.1f}")
    return row


def fastest_run(runs: list[dict]) -> dict:
    """A configuration's row: its fastest run by epoch time (a failed run makes the row failed),
    with every run's epoch time and their median beside it."""
    failed = [r for r in runs if r.get("epoch_s") is None]
    times = sorted(r["epoch_s"] for r in runs if r.get("epoch_s") is not None)
    row = dict(failed[0] if failed else min(runs, key=lambda r: r["epoch_s"]))
    row["runs_epoch_s"] = [r.get("epoch_s") for r in runs]
    if times and not failed:
        row["median_epoch_s"] = times[(len(times) - 1) // 2]
    return row


def shapes_of(t: dict) -> list[tuple[str, dict, list[dict]]]:
    """(name, graph, rows) per shape measured; a result written before shapes existed is one shape."""
    if "shapes" not in t:
        return [("", dict(t["graph"], edges_directed=t.get("edges"), epochs=t["epochs"]), t["rows"])]
    return [(name, g, [r for r in t["rows"] if r.get("shape") == name]) for name, g in t["shapes"].items()]


def describe(g: dict) -> str:
    order = ("features no wider than the hidden layer: both trainers compute the first layer as Â·X first"
             if g["features"] <= g["hidden"] else
             "features wider than the hidden layer: both trainers compute the first layer as X·W1 first")
    edges = g.get("edges_directed") or g["edges"]
    return (f"synthetic graph {g['nodes']:,} nodes / {edges:,} directed edges / {g['features']} features / "
            f"{g['classes']} classes, hidden {g['hidden']} ({order}, see workloads/README.md), "
            f"{g['epochs']} timed epochs per run")


def render(t: dict | None, plot_rel: str | None = None) -> list[str]:
    out = ["## Strong scaling: the partitioned GCN on 1 and 2 cores", ""]
    if not t:
        return out + ["Not measured in this run.", ""]
    m = t.get("machine", {})
    shapes = shapes_of(t)
    out += [f"`bench/train.py`, on {len(shapes)} graph shape{'s' if len(shapes) > 1 else ''} (a table each); "
            f"each configuration runs once untimed, then {t.get('repeats', 1)} times timed, in rounds (every "
            "configuration once per round), and its row is its "
            f"{'fastest' if any('median_epoch_s' in r for r in t['rows']) else 'median'} run; Metis parts (k-way). Each rank pinned "
            f"to its own core (`mpirun --bind-to core`) except 1 x 2 (`--bind-to none`); {m.get('cpus', '?')} cores; "
            "the 1-min load average when each row "
            "finished is in its last column (other work on the machine only slows a row down). Epoch = forward, "
            "backward, gradient allreduce, update; the slowest rank's mean after the first epoch. Communication "
            "is the time inside the halo exchanges (and, for gcn_torch, the gradient allreduce; gcn_torch's "
            "exchanges of X·W1's and the second layer's rows overlap the sparse product over the rank's own "
            "columns, so they count the time spent starting them and waiting after it; gcn_jittor's exchanges "
            "end before its one product over every column, and its allreduce runs inside Jittor's optimizer "
            "and is counted in bytes only); bytes are what each rank sent per epoch.", ""]
    for name, g, rows in shapes:
        out += [f"### {name + ': ' if name else ''}{describe(g)}", "",
                "| workload | configuration | s/epoch | speedup vs 1 x 1 | per rank: compute s / communication s | "
                "per rank: halo MiB / allreduce KiB sent | test acc | load | every run's s/epoch |",
                "|---|---|---:|---:|---|---|---:|---:|---|"]
        for r in rows:
            if r.get("epoch_s") is None:
                out.append(f"| {r['workload']} | {r['label']} | failed | | `{r.get('error', '')[-200:].replace('|', '/')}` | | | | |")
                continue
            per = "; ".join(f"{p['compute_s']:.4f} / {p['comm_s']:.4f}" for p in r["ranks_profile"])
            byt = "; ".join(f"{p['halo_bytes'] / 2**20:.2f} / {p['allreduce_bytes'] / 1024:.1f}" for p in r["ranks_profile"])
            sp = r.get("speedup")
            every = ", ".join("failed" if e is None else f"{e:.4f}" for e in r.get("runs_epoch_s", [r["epoch_s"]]))
            out.append(f"| {r['workload']} | {r['label']} | {r['epoch_s']:.4f} | {f'{sp:.2f}' if sp else 'n/a'} | {per} | "
                       f"{byt} | {r['test_acc']:.3f} | {r['load_1min']:.1f} | {every} |")
        out.append("")
        for w in sorted({r["workload"] for r in rows}):
            two = next((r for r in rows if r["workload"] == w and r["ranks"] == 2 and r.get("speedup")), None)
            if two:
                out.append(f"**Target** (2 ranks at least {TARGET} x faster than 1 rank x 1 thread), {w}"
                           f"{', ' + name if name else ''}: {two['speedup']:.2f}"
                           + (f" (of the medians: {two['median_speedup']:.2f})" if two.get("median_speedup") else "")
                           + f" at load {two['load_1min']:.1f} — "
                           f"**{'met' if two['speedup'] >= TARGET else 'not met'}**.")
        out.append("")
    notes = t.get("notes") or []
    if notes:
        out += [*notes, ""]
    if plot_rel:
        out += [f"![Strong scaling: epoch time split into compute and communication]({plot_rel})", ""]
    return out


def plot(t: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in t["rows"] if r.get("epoch_s") is not None]
    panels = sorted({(r.get("shape", ""), r["workload"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (shape, w) in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if r["workload"] == w and r.get("shape", "") == shape]
        labels = [r["label"].replace(" x ", "\nx ") for r in mine]
        slow = [max(r["ranks_profile"], key=lambda p: p["epoch_s"]) for r in mine]
        comp = [p["compute_s"] for p in slow]
        comm = [p["comm_s"] for p in slow]
        ax.bar(labels, comp, label="compute")
        ax.bar(labels, comm, bottom=comp, label="communication")
        for i, r in enumerate(mine):
            if r.get("speedup"):
                ax.text(i, comp[i] + comm[i], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=9)
        ax.set_title(f"{w}, {shape}" if shape else w)
        ax.set_ylabel("seconds per epoch (slowest rank)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="half the epochs, one timed run per configuration")
    ap.add_argument("--workloads", nargs="+", default=["gcn_torch", "gcn_jittor"], choices=["gcn_torch", "gcn_jittor"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "train.json")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else REPEATS
    shapes = {name: dict(SHAPES[name], epochs=SHAPES[name]["epochs"] // (2 if args.quick else 1)) for name in args.shapes}
    data: dict = {"shapes": shapes, "repeats": repeats, "machine": machine(), "rows": []}
    port = 29700
    for name, g in shapes.items():
        with tempfile.TemporaryDirectory(prefix="bench-train-parts-") as d:
            parts = {n: partition(Path(d), g, n) for n in (1, 2)}
            g["edges_directed"] = json.loads((parts[1] / "manifest.json").read_text())["num_edges"]
            runs: dict[tuple[str, str], list[dict]] = {}
            for i in range(repeats):  # rounds: a slow spell on the machine hits every configuration alike
                for w in args.workloads:
                    for label, ranks, threads, bind in CONFIGS:
                        port += 1
                        runs.setdefault((w, label), []).append(
                            one(w, name, label, ranks, threads, bind, parts[ranks], g["epochs"], port, warm_up=i == 0))
            data["rows"] += [fastest_run(r) for r in runs.values()]
    for name in shapes:
        for w in args.workloads:
            mine = [r for r in data["rows"] if r["workload"] == w and r["shape"] == name]
            base = next((r for r in mine if r["label"] == CONFIGS[0][0] and r.get("epoch_s")), None)
            for r in mine:
                if base and r.get("epoch_s"):
                    r["speedup"] = base["epoch_s"] / r["epoch_s"]
                    if base.get("median_epoch_s") and r.get("median_epoch_s"):
                        r["median_speedup"] = base["median_epoch_s"] / r["median_epoch_s"]
    write_json(args.json, data)
    say("\n".join(render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
