#!/usr/bin/env python3
"""The CLI's verbs on more than 3 real nodes: light podman nodes, one set brought up once.

    .venv/bin/python bench/nodes.py [--sizes 3 8 16] [--json OUT]

Brings up max(sizes) light nodes (``distrun-nodes``: bare Debian containers with systemd and
sshd, no torch, Jittor or Slurm: Open MPI, a venv with mpi4py and numpy, an sshfs shared folder)
and writes one INI inventory per size with aliases (``alpha``, ``w2`` .. ``wN``) listing the first
N of them. Then, in this order:

  setup     first converge of the smallest size, its re-run; first converge of the largest size
            (its first nodes already converged, the rest fresh), its re-run
  per size  `distrun check` twice in a row (wall, and every failure either run reported: the
            first logs in from every node to every other, the second checks sshd banners),
            `distrun train --script` of a 1-second mpi4py job three times (launch overhead =
            wall - 1 s; the run record's collect phase), `train --detach` of a long job and
            `distrun stop` of it
  lost node the last node stopped: `distrun check` (does it name it) and `distrun train` (refused)

Always tears the nodes down. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DISTRUN, REPO, CliHome, machine, median, run, run_cpu, say, write_json  # noqa: E402
from cluster import RECAP, RUN_ID  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.harness import podcluster  # noqa: E402

NAME = "distrun-nodes"
JOB_S = 1.0
TRAIN_REPS = 3

ONE_SECOND = '''\
"""mpi4py: every rank meets, sleeps 1 s, meets again."""
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
time.sleep(1)
comm.Barrier()
print(f"rank {comm.Get_rank()}/{comm.Get_size()} done", flush=True)
'''

LONG = '''\
"""mpi4py: every rank meets every second for 10 minutes (stopped by distrun stop)."""
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
for _ in range(600):
    comm.Barrier()
    time.sleep(1)
'''

# Light nodes: the contract's defaults, sshfs, and nothing the benchmark does not run.
GROUP_VARS = """\
distrun_user: distrun
distrun_shared_dir: /srv/distrun
distrun_shared_fs_mode: sshfs
distrun_mpi_provider: venv
distrun_env_prefix: /opt/distrun/venv
distrun_hostfile: "{{ distrun_shared_dir }}/hostfile"
slurm_enabled: false
"""


def task_spans(run_dir: Path, top: int = 4) -> dict[str, float]:
    """The longest tasks of a run's playbooks: from each task's start event to the next task's
    (or the play's last event), from ansible-runner's job events."""
    try:
        return _task_spans(run_dir, top)
    except Exception as exc:  # noqa: BLE001 - a figure missing, not a benchmark stopped
        return {f"task spans unreadable: {type(exc).__name__}: {exc}": 0.0}


def _task_spans(run_dir: Path, top: int) -> dict[str, float]:
    events = []
    for ev in run_dir.glob("ansible/artifacts/*/job_events/*.json"):
        try:
            e = json.loads(ev.read_text())
            ts = dt.datetime.fromisoformat(e["created"].replace("Z", "+00:00")).timestamp()
        except (OSError, ValueError, KeyError):
            continue
        events.append((ts, e.get("event"), (e.get("event_data") or {}).get("task", "")))
    events.sort()
    spans: dict[str, float] = {}
    starts = [(ts, task) for ts, kind, task in events if kind == "playbook_on_task_start"]
    for (ts, task), nxt in zip(starts, [*starts[1:], (events[-1][0], "")] if events else [], strict=False):
        spans[task] = round(spans.get(task, 0) + nxt[0] - ts, 2)
    return dict(sorted(spans.items(), key=lambda kv: -kv[1])[:top])


def latest(home: Path, verb: str) -> Path | None:
    found = sorted((home / "runs").glob(f"*-{verb}-*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def alias(k: int) -> str:
    return "alpha" if k == 1 else f"w{k}"


class Nodes(CliHome):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.inv = tmp / "inv"

    def write_inventories(self, cluster: podcluster.Cluster, sizes: list[int]) -> None:
        import yaml

        harness = yaml.safe_load(cluster.inventory.read_text())["all"]["vars"]
        (self.inv / "group_vars").mkdir(parents=True, exist_ok=True)
        (self.inv / "group_vars" / "all.yml").write_text(GROUP_VARS + yaml.safe_dump(harness))
        for n in sizes:
            (self.inv / f"hosts-{n}.ini").write_text(
                "[head]\nalpha\n\n[workers]\n"
                + "".join(f"{alias(k)} ansible_host={cluster.ip(k)} slots=1\n" for k in range(1, n + 1)))

    def hosts(self, n: int) -> str:
        return str(self.inv / f"hosts-{n}.ini")

    def setup(self, n: int, label: str) -> dict:
        proc, wall = run([DISTRUN, "setup", "--inventory", self.hosts(n)], env=self.env(), timeout=1800)
        m = RECAP.search(proc.stdout)
        row = {"nodes": n, "label": label, "wall_s": round(wall, 1), "rc": proc.returncode,
               "changed": int(m[3]) if m else None, "failed": int(m[4]) if m else None}
        if proc.returncode:
            row["error"] = (proc.stdout[-1500:] + proc.stderr[-800:]).strip()
        say(f"setup {label:<40} {n:>3} nodes {wall:7.1f} s changed={row['changed']} rc={proc.returncode}")
        return row

    def check(self, n: int, extra: dict | None = None) -> dict:
        proc, wall, cpu = run_cpu([DISTRUN, "check", "--inventory", self.hosts(n), "--json"], env=self.env(extra),
                                  timeout=900)
        row: dict = {"wall_s": round(wall, 2), "rc": proc.returncode, "json_bytes": len(proc.stdout), "cpu": cpu}
        try:
            out = json.loads(proc.stdout)
        except ValueError:
            row["error"] = (proc.stdout[-800:] + proc.stderr[-800:]).strip()
            out = {}
        row["ok"] = out.get("ok")
        row["failures"] = [f"{check}/{node}: {item.get('detail', '')}"[:300]
                           for check, items in (out.get("checks") or {}).items()
                           for node, item in items.items() if not item.get("ok")]
        record = latest(self.home, "check")
        row["tasks"] = task_spans(record) if record else {}
        row["hosts_not_ok"] = {h: s.get("state") for h, s in (out.get("hosts") or {}).items() if s.get("state") != "ok"}
        say(f"check {n:>3} nodes {wall:6.2f} s rc={proc.returncode} failures={len(row['failures'])}"
            + "".join(f"\n    {f}" for f in row["failures"][:8]))
        return row

    def train(self, n: int, script: Path, *extra: str, env: dict | None = None) -> dict:
        proc, wall, cpu = run_cpu([DISTRUN, "train", "--inventory", self.hosts(n), "--script", str(script), *extra],
                                  env=self.env(env), timeout=900)
        row: dict = {"wall_s": round(wall, 2), "rc": proc.returncode, "cpu": cpu}
        m = RUN_ID.search(proc.stdout)
        timings = Path(m[2]) / "timings.json" if m else None
        if m:
            row["tasks"] = task_spans(Path(m[2]))
            row["record_bytes"] = sum(f.stat().st_size for f in Path(m[2]).rglob("*") if f.is_file())
        if timings and timings.exists():
            row["phases"] = {p["name"]: round(p["s"], 2) for p in json.loads(timings.read_text())["phases"]}
        if "--detach" in extra and proc.returncode == 0:
            row["run_id"] = proc.stdout.strip().splitlines()[-1]
        if proc.returncode:
            row["error"] = (proc.stdout[-1200:] + proc.stderr[-1200:]).strip()
        say(f"train {script.name} {' '.join(extra)} {n:>3} nodes {wall:6.2f} s rc={proc.returncode}"
            f" collect={(row.get('phases') or {}).get('collect')}")
        return row

    def stop(self, run_id: str) -> dict:
        proc, wall = run([DISTRUN, "stop", run_id], env=self.env(), timeout=600)
        say(f"stop {run_id} {wall:6.2f} s rc={proc.returncode}")
        return {"wall_s": round(wall, 2), "rc": proc.returncode,
                **({"error": (proc.stdout[-800:] + proc.stderr[-800:]).strip()} if proc.returncode else {})}

    def size(self, n: int) -> dict:
        one, long = self.tmp / "one_second.py", self.tmp / "long.py"
        row: dict = {"nodes": n, "check": [self.check(n), self.check(n)]}
        row["train"] = [self.train(n, one) for _ in range(TRAIN_REPS)]
        ok = [t["wall_s"] for t in row["train"] if t["rc"] == 0]
        row["train_median_s"] = median(ok) if ok else None
        collect = [t["phases"]["collect"] for t in row["train"] if "collect" in (t.get("phases") or {})]
        row["collect_median_s"] = median(collect) if collect else None
        detach = self.train(n, long, "--detach")
        row["detach"] = detach
        if detach.get("run_id"):
            row["stop"] = self.stop(detach["run_id"])
        return row

    def fewer_forks(self, n: int) -> dict:
        """check and train with fewer Ansible forks than nodes, as every cluster past 20 nodes
        runs with ansible.cfg's forks = 20: the probes of one play no longer all run at once."""
        forks = {"ANSIBLE_FORKS": str(max(1, n // 2))}
        say(f"with ANSIBLE_FORKS={forks['ANSIBLE_FORKS']} on {n} nodes:")
        return {"nodes": n, "forks": int(forks["ANSIBLE_FORKS"]), "check": self.check(n, forks),
                "train": self.train(n, self.tmp / "one_second.py", env=forks)}

    def lost_node(self, cluster: podcluster.Cluster, n: int) -> dict:
        cluster.stop_node(n)
        out: dict = {"nodes": n, "stopped": alias(n)}
        out["check"] = self.check(n)
        out["check"]["names_it"] = alias(n) in out["check"]["hosts_not_ok"] or any(
            f"/{alias(n)}:" in f for f in out["check"]["failures"])
        t = self.train(n, self.tmp / "one_second.py")
        t["names_it"] = alias(n) in t.get("error", "")
        t["refused"] = t["rc"] != 0 and "collect" not in (t.get("phases") or {})
        out["train"] = t
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 8, 16])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = sorted(set(args.sizes))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-nodes-"))
    tmp.chmod(0o700)
    bench = Nodes(tmp)
    (tmp / "one_second.py").write_text(ONE_SECOND)
    (tmp / "long.py").write_text(LONG)
    result: dict = {"machine": machine(), "sizes": sizes, "job_s": JOB_S, "shared_fs": "sshfs", "inventory": "INI aliases"}
    started = time.monotonic()
    cluster = None
    try:
        cluster = podcluster.up(sizes[-1], name=NAME, inventory=tmp / "harness.yml", wait_s=300)
        result["up_s"] = round(time.monotonic() - started, 1)
        say(f"{sizes[-1]} nodes up in {result['up_s']} s")
        bench.write_inventories(cluster, sizes)
        setup = [bench.setup(sizes[0], "first converge"), bench.setup(sizes[0], "re-run")]
        if setup[0]["rc"] == 0 and len(sizes) > 1:
            setup += [bench.setup(sizes[-1], f"first converge (first {sizes[0]} converged)"),
                      bench.setup(sizes[-1], "re-run")]
        result["setup"] = setup
        if all(r["rc"] == 0 for r in setup):
            result["rows"] = []
            for n in sizes:
                try:
                    result["rows"].append(bench.size(n))
                except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
                    result["rows"].append({"nodes": n, "error": f"{type(exc).__name__}: {exc}"})
            try:
                result["fewer_forks"] = bench.fewer_forks(sizes[-1])
            except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
                result["fewer_forks"] = {"error": f"{type(exc).__name__}: {exc}"}
            result["lost"] = bench.lost_node(cluster, sizes[-1])
    finally:
        if cluster is not None:
            cluster.down()
        else:
            podcluster.down(NAME)
        result["total_s"] = round(time.monotonic() - started, 1)
        say(f"cluster {NAME} removed; {result['total_s']} s in all")
        if args.json:
            write_json(args.json, result)
        shutil.rmtree(tmp, ignore_errors=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nodes_report

    say("\n".join(nodes_report.console(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
