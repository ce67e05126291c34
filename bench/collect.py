#!/usr/bin/env python3
"""What a run's end costs when its job wrote big files into the run directory, and what
'distrun fetch' costs for them afterwards, on a 3-node podman cluster.

    .venv/bin/python bench/collect.py [--quick] [--json OUT]

Starts its own cluster ``distrun-bench`` and converges setup.yml (as bench/cluster.py), always
tears it down. Then, alternating, the same mpi4py program with and without extra files: rank 0
writes EXTRA_MIB of incompressible data into the run directory in 4 files, every rank a small
result file. Reported: the runner's "collect" phase (timings.json of the record) of each run,
the median of each kind and their difference, and `distrun fetch` of the extra files (the bytes
the run's end no longer carries). This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DISTRUN, REPO, machine, median, run, say, write_json  # noqa: E402
from cluster import NAME, RUN_ID, Bench  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.harness import podcluster  # noqa: E402

EXTRA_MIB = 1024

PROGRAM = '''\
"""mpi4py: rank 0 writes {mib} MiB of random data in 4 files (when asked), every rank a result."""
import json, os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
os.makedirs("out", exist_ok=True)
if rank == 0 and sys.argv[1:] == ["extra"]:
    block = os.urandom(1 << 20)
    for i in range(4):
        with open(f"out/shard{{i}}.bin", "wb") as f:
            for j in range({mib} // 4):
                f.write(block[j % 7:] + block[:j % 7])
json.dump({{"rank": rank}}, open(f"out/result-{{rank}}.json", "w"))
comm.Barrier()
'''


def one_run(bench: Bench, script: Path, extra: bool) -> dict:
    args = [DISTRUN, "train", "--inventory", str(bench.hosts), "--script", str(script)]
    proc, wall = run([*args, "--", "extra"] if extra else args, env=bench.env(), timeout=900)
    m = RUN_ID.search(proc.stdout)
    row: dict = {"extra": extra, "rc": proc.returncode, "wall_s": round(wall, 2), "run_id": m[1] if m else None}
    if m:
        timings = json.loads((Path(m[2]) / "timings.json").read_text())
        row["collect_s"] = next((p["s"] for p in timings["phases"] if p["name"] == "collect"), None)
        left = Path(m[2]) / "left-on-nodes.json"
        row["left_bytes"] = sum(h["bytes"] for h in json.loads(left.read_text())["hosts"].values()) if left.is_file() else 0
    if proc.returncode != 0:
        row["error"] = (proc.stdout[-1500:] + proc.stderr[-800:]).strip()
    say(f"run {'with' if extra else 'without':<7} {EXTRA_MIB} MiB extra: wall {wall:6.2f} s, collect "
        f"{row.get('collect_s')} s, left on the nodes {row.get('left_bytes', 0) / (1 << 20):.0f} MiB rc={proc.returncode}")
    return row


def fetch(bench: Bench, run_id: str) -> dict:
    proc, wall = run([DISTRUN, "fetch", run_id, "out"], env=bench.env(), timeout=900)
    say(f"distrun fetch {run_id} out: {wall:6.2f} s rc={proc.returncode} {proc.stdout.strip()}")
    return {"wall_s": round(wall, 2), "rc": proc.returncode, "said": proc.stdout.strip()[-300:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 runs of each kind instead of 3")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-bench-collect-"))
    tmp.chmod(0o700)
    bench = Bench(tmp, args.quick)
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", bench.inv_dir / "group_vars")
    result: dict = {"machine": machine(), "extra_mib": EXTRA_MIB}
    cluster = None
    try:
        cluster = podcluster.up(3, name=NAME, wheelhouse=Path("/opt/wheels"), inventory=bench.hosts)
        setup = bench.setup("first converge")
        result["setup_rc"] = setup["rc"]
        if setup["rc"] == 0:
            script = tmp / "outputs.py"
            script.write_text(PROGRAM.format(mib=EXTRA_MIB))
            one_run(bench, script, False)  # the first run gathers facts: not counted
            rows = []
            for _ in range(2 if args.quick else 3):
                rows += [one_run(bench, script, False), one_run(bench, script, True)]
            result["runs"] = rows
            plain = [r["collect_s"] for r in rows if not r["extra"] and r["rc"] == 0 and r.get("collect_s") is not None]
            extra = [r["collect_s"] for r in rows if r["extra"] and r["rc"] == 0 and r.get("collect_s") is not None]
            if plain and extra:
                result["collect_median_s"] = {"without": median(plain), "with": median(extra)}
                result["added_s"] = round(median(extra) - median(plain), 3)
            last = next((r for r in reversed(rows) if r["extra"] and r["rc"] == 0), None)
            if last is not None:
                t0 = time.monotonic()
                result["fetch"] = fetch(bench, last["run_id"])
                result["fetch"]["seconds"] = round(time.monotonic() - t0, 2)
    finally:
        if cluster is not None:
            cluster.down()
        else:
            podcluster.down(NAME)
        if args.json:
            write_json(args.json, result)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def render(c: dict | None) -> list[str]:
    """The Markdown section of docs/benchmarks.md."""
    out = ["## Collect: a run's end with big outputs in its run directory (3 nodes)", ""]
    if not c or "runs" not in c:
        return out + ["Not measured in this run" + (f" (setup rc {c.get('setup_rc')})" if c else "") + ".", ""]
    out += [f"The same mpi4py program, alternating: without extra files, and with rank 0 writing {c['extra_mib']} MiB of "
            "incompressible data into the run directory (4 files). The runner's `collect` phase of each run "
            "(`timings.json`); the bigger files stay on the node, listed in the record, and `distrun fetch` brings "
            f"them afterwards. 1-min load average {c['machine']['load_1min_at_start']} at start.", "",
            "| run | rc | wall s | collect s | left on the nodes MiB |", "|---|---:|---:|---:|---:|"]
    for r in c["runs"]:
        out.append(f"| {'with' if r['extra'] else 'without'} {c['extra_mib']} MiB extra | {r['rc']} | {r['wall_s']} | "
                   f"{r.get('collect_s')} | {r.get('left_bytes', 0) / (1 << 20):.0f} |")
    if "added_s" in c:
        m = c["collect_median_s"]
        out += ["", f"Median collect: {m['without']:.3f} s without, {m['with']:.3f} s with the extra files: "
                    f"**{c['added_s']:+.3f} s** (target ≤ 0.5 s)."]
    fx = c.get("fetch")
    if fx:
        out += [f"`distrun fetch RUN out` afterwards (the {c['extra_mib']} MiB the run's end no longer carries): "
                f"{fx['wall_s']} s, rc {fx['rc']}."]
    return out + [""]


def summary_row(c: dict | None) -> list[str]:
    if not c or "added_s" not in c:
        return []
    m = c["collect_median_s"]
    return [f"| collect with {c['extra_mib']} MiB of extra files in the run dir | {m['with']:.2f} s | without: "
            f"{m['without']:.2f} s | ≤ +0.5 s | {'met' if c['added_s'] <= 0.5 else 'not met'} ({c['added_s']:+.2f} s) |"]


if __name__ == "__main__":
    sys.exit(main())
