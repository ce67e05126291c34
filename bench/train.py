#!/usr/bin/env python3
"""Training epoch time for 1, 2 and 3 ranks on one synthetic graph, on this machine.

    .venv/bin/python bench/train.py [--quick] [--json OUT]

Runs workloads/gcn_ddp.py (PyTorch DDP, gloo) under this machine's mpirun with --oversubscribe
and --allow-run-as-root, ranks 1, 2, 3 on the same generated graph and seed. Epoch time is the
mean of the epochs after the first (the first includes allocator warm-up and DDP's first bucket
set-up; reported apart). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, run, say, write_json  # noqa: E402

EPOCH = re.compile(r"DISTRUN_EPOCH (\{.*\})")
RESULT = re.compile(r"DISTRUN_RESULT (\{.*\})")


def one(ranks: int, graph: dict, epochs: int, port: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="distrun-bench-train-") as d:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--allow-run-as-root",
               "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", "-x", "OMP_NUM_THREADS=1",
               sys.executable, str(REPO / "workloads" / "gcn_ddp.py"), "--dataset", "synthetic",
               "--syn-nodes", str(graph["nodes"]), "--syn-edges", str(graph["edges"]),
               "--syn-features", str(graph["features"]), "--hidden", str(graph["hidden"]),
               "--epochs", str(epochs), "--result-file", f"{d}/result.json"]
        env = dict(os.environ, DISTRUN_RUN_DIR=d)
        proc, wall = run(cmd, env=env, timeout=900)
    times = [json.loads(m)["epoch_time_s"] for m in EPOCH.findall(proc.stdout)]
    res = RESULT.findall(proc.stdout)
    row = {"ranks": ranks, "rc": proc.returncode, "wall_s": round(wall, 2), "epochs_seen": len(times),
           "first_epoch_s": round(times[0], 4) if times else None,
           "epoch_s": round(statistics.mean(times[1:]), 4) if len(times) > 1 else None,
           "epoch_s_stdev": round(statistics.stdev(times[1:]), 4) if len(times) > 2 else None,
           "test_acc": json.loads(res[-1]).get("test_acc") if res else None}
    if proc.returncode != 0:
        row["error"] = (proc.stdout[-600:] + proc.stderr[-1200:]).strip()
    say(f"train gcn_ddp {ranks} rank(s): {row['epoch_s']} s/epoch (first {row['first_epoch_s']} s), "
        f"wall {wall:.1f} s rc={proc.returncode}")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    graph = {"nodes": 50_000, "edges": 1_000_000, "features": 64, "hidden": 64}
    epochs = 10 if args.quick else 30
    rows = [one(r, graph, epochs, 29600 + r) for r in (1, 2, 3)]
    base = rows[0]["epoch_s"]
    for r in rows:
        r["speedup"] = round(base / r["epoch_s"], 2) if base and r["epoch_s"] else None
    if args.json:
        write_json(args.json, {"graph": graph, "epochs": epochs, "cpus": os.cpu_count(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
