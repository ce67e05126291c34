#!/usr/bin/env python3
"""The controller's CPU per added node, at small sizes, on light nodes brought up once and kept.

    .venv/bin/python bench/slope.py up      --dir D [--name NAME] [--sizes 2 4]
    .venv/bin/python bench/slope.py measure --dir D [--sizes 2 4] [--reps 2] [--json OUT] [--label L]
    .venv/bin/python bench/slope.py down    --dir D [--name NAME]

``up`` brings up max(sizes) light nodes (bench/nodes.py's: Debian, systemd, sshd, Open MPI, an
sshfs shared folder) and sets up the largest size; ``measure`` runs, per size, ``distrun check``
twice in a row and ``distrun train --script`` of a 1-second mpi4py job ``reps`` times, and prints
the controller's CPU (the command's own process tree, bench/_common.run_cpu's ``command_s``) per
verb and size, and its slope: CPU seconds per added node between the smallest and the largest
size, and each Ansible task's share of it (bench/callback_plugins/cpu_tasks.py). It can be run again and again on the same nodes (before and after a change). ``down``
removes the nodes. Run it under ``flock /work/locks/bench.lock``; a benchmark, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, median, say, write_json  # noqa: E402
from nodes import LONG, ONE_SECOND, Nodes  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.harness import podcluster  # noqa: E402


def _bench(d: Path) -> Nodes:
    bench = Nodes.__new__(Nodes)
    bench.tmp, bench.home, bench.n_cp, bench.inv = d / "run", d / "run" / "home", 0, d / "inv"
    bench.home.mkdir(mode=0o700, exist_ok=True)
    return bench


def up(d: Path, name: str, sizes: list[int]) -> int:
    d.mkdir(mode=0o700, parents=True, exist_ok=False)
    (d / "run").mkdir(mode=0o700)
    bench = _bench(d)
    (d / "run" / "one_second.py").write_text(ONE_SECOND)
    (d / "run" / "long.py").write_text(LONG)
    cluster = podcluster.up(max(sizes), name=name, inventory=d / "harness.yml", wait_s=300)
    bench.write_inventories(cluster, sizes)
    row = bench.setup(max(sizes), "first converge")
    return 0 if row["rc"] == 0 else 1


def _fresh_cp(bench: Nodes) -> None:
    """Every command gets a fresh ControlPath folder (CliHome.env): number them past what is there."""
    bench.n_cp = max([int(p.name[2:]) for p in bench.tmp.glob("cp*") if p.name[2:].isdigit()] or [0])


def measure(d: Path, sizes: list[int], reps: int, out: Path | None, label: str) -> int:
    bench = _bench(d)
    _fresh_cp(bench)
    one = bench.tmp / "one_second.py"
    rows: dict[int, dict] = {}
    prof = d / "profile" / label
    prof.mkdir(parents=True, exist_ok=True)

    def cb(verb: str, n: int, i: int) -> dict:
        """The per-task CPU callback (bench/callback_plugins/cpu_tasks.py), its lines in one file per command."""
        out = prof / f"{verb}-{n}-{i}.jsonl"
        out.unlink(missing_ok=True)
        return {"ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).resolve().parent / "callback_plugins"),
                "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,cpu_tasks", "DISTRUN_CPU_TASKS": str(out)}

    for n in sizes:
        checks = [bench.check(n, cb("check", n, i)) for i in range(reps)]
        trains = [bench.train(n, one, env=cb("train", n, i)) for i in range(reps)]
        rows[n] = {
            "check_first_cpu": checks[0]["cpu"]["command_s"],
            "check_again_cpu": median([c["cpu"]["command_s"] for c in checks[1:]]) if reps > 1 else None,
            "check_wall": median([c["wall_s"] for c in checks]),
            "check_ok": all(c.get("ok") for c in checks),
            "train_cpu": median([t["cpu"]["command_s"] for t in trains]),
            "train_wall": median([t["wall_s"] for t in trains]),
            "train_ok": all(t["rc"] == 0 for t in trains),
            "check_tasks": checks[0].get("tasks"), "train_tasks": trains[0].get("tasks"),
            "errors": [r["error"][-600:] for r in [*checks, *trains] if r.get("error")],
        }
    lo, hi = min(sizes), max(sizes)
    slope = {k: round((rows[hi][k] - rows[lo][k]) / (hi - lo), 3)
             for k in ("check_first_cpu", "check_again_cpu", "train_cpu") if rows[lo][k] is not None}
    say(f"{'nodes':>5} {'check cpu':>10} {'again cpu':>10} {'train cpu':>10} {'check wall':>11} {'train wall':>11} ok")
    for n, r in rows.items():
        say(f"{n:>5} {r['check_first_cpu']:>10.2f} {r['check_again_cpu'] or 0:>10.2f} {r['train_cpu']:>10.2f}"
            f" {r['check_wall']:>11.2f} {r['train_wall']:>11.2f} {r['check_ok'] and r['train_ok']}")
        for e in r["errors"]:
            say(f"      error: {e}")
    say("controller CPU-s per added node: " + ", ".join(f"{k} {v}" for k, v in slope.items()))
    tasks = {f"{verb} {i}": per_task(prof, verb, i, lo, hi) for verb in ("check", "train") for i in range(min(reps, 2))}
    for what, table in tasks.items():
        say(f"\n{what}: controller CPU-s per task at {lo} and {hi} nodes (ansible-playbook + its workers), per added node")
        for name, (a, b) in sorted(table.items(), key=lambda kv: -(kv[1][1] - kv[1][0])):
            say(f"  {(b - a) / (hi - lo):7.3f}/node {a:6.2f} {b:6.2f}  {name[:90]}")
    if out:
        write_json(out, {"label": label, "sizes": sizes, "reps": reps, "rows": rows, "slope": slope, "tasks": tasks})
    return 0


def per_task(prof: Path, verb: str, i: int, lo: int, hi: int) -> dict[str, tuple[float, float]]:
    """Each task's controller CPU (its figures summed where a name repeats) at the two sizes."""
    def read(n: int) -> dict[str, float]:
        f = prof / f"{verb}-{n}-{i}.jsonl"
        got: dict[str, float] = {}
        for line in (f.read_text().splitlines() if f.exists() else []):
            r = json.loads(line)
            got[r["task"]] = round(got.get(r["task"], 0) + r["self_s"] + r["workers_s"], 3)
        return got
    a, b = read(lo), read(hi)
    return {k: (a.get(k, 0.0), b.get(k, 0.0)) for k in {*a, *b}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["up", "measure", "down"])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--name", default="distrun-nodes")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--label", default="now", help="measure: the folder under DIR/profile its per-task lines go to")
    args = ap.parse_args(argv)
    sizes = sorted(set(args.sizes))
    if args.what == "up":
        return up(args.dir, args.name, sizes)
    if args.what == "measure":
        return measure(args.dir, sizes, args.reps, args.json, args.label)
    podcluster.down(args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
