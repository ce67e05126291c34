#!/usr/bin/env python3
"""Scale on paper: inventory -> plan -> hostfile -> mpirun argv for generated N-node inventories.

    .venv/bin/python bench/scale.py [--sizes 3 100 1000] [--json OUT]

For each N a YAML inventory is generated (group head: 1 host; workers: N hosts with 8 slots).
Measured: `ansible-inventory --list` on it (the step every distrun verb starts with), the pure
runner steps in a fresh child process (cluster_from_json, build_plan, plan.render_hostfile,
launchers.mpirun_argv; median of 5 repeats; peak RSS of the child), and the real
`distrun hostfile -i <yaml>` (wall time and peak RSS of the process tree it waits for).
Nothing connects to a host. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DISTRUN, REPO, say, write_json  # noqa: E402

CHILD = r'''
import json, resource, statistics, sys, time
from pathlib import Path
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
from distrun.inventory.cluster import cluster_from_json
from distrun.planning.plan import build_plan, render_hostfile
from distrun.planning.request import JobRequest, ProgramRequest
from distrun.launchers import mpirun_argv
import_s = time.perf_counter() - t
path = Path(sys.argv[1]); data = json.loads(Path(sys.argv[2]).read_text())
steps = {"cluster_from_json": [], "build_plan": [], "render_hostfile": [], "mpirun_argv": []}
for _ in range(5):
    t = time.perf_counter(); cluster = cluster_from_json(path, data); steps["cluster_from_json"].append(time.perf_counter() - t)
    t = time.perf_counter(); plan = build_plan(cluster, JobRequest(path, ProgramRequest(script=Path("train.py"))), run_id="BENCH"); steps["build_plan"].append(time.perf_counter() - t)
    t = time.perf_counter(); hf = render_hostfile(plan); steps["render_hostfile"].append(time.perf_counter() - t)
    t = time.perf_counter(); argv = mpirun_argv(plan); steps["mpirun_argv"].append(time.perf_counter() - t)
out = {k: statistics.median(v) for k, v in steps.items()}
out.update(import_s=import_s, world_size=plan.placement.world_size, hosts=len(plan.placement.hosts), hostfile_bytes=len(hf),
           argv_words=len(argv), argv_bytes=len(" ".join(argv)),
           peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           rss_before_imports_mib=rss0 / 1024)
print(json.dumps(out))
'''


def inventory_yaml(n: int, slots: int = 8) -> str:
    lines = ["all:", "  vars:", "    distrun_user: distrun", "    distrun_shared_dir: /srv/distrun",
             "    distrun_mpi_provider: venv", "  children:", "    head:", "      hosts:",
             "        node0001:", "    workers:", "      hosts:"]
    for i in range(1, n + 1):
        ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        lines += [f"        node{i:04d}:", f"          ansible_host: {ip}", f"          slots: {slots}"]
    return "\n".join(lines) + "\n"


def measure_cli(cmd: list[str], env: dict) -> dict:
    code = ("import resource,subprocess,sys,time,json;t=time.monotonic();"
            "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);w=time.monotonic()-t;"
            "print(json.dumps({'rc':p.returncode,'wall_s':w,'peak_rss_mib':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024,'stdout_bytes':len(p.stdout),'stdout_lines':p.stdout.count(chr(10))}))")
    proc = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=env, cwd=REPO)
    return json.loads(proc.stdout)


def one(n: int, tmp: Path) -> dict:
    inv = tmp / f"inv{n}" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text(inventory_yaml(n))
    env = dict(os.environ, DISTRUN_HOME=str(tmp / "home"), ANSIBLE_NOCOLOR="1")
    ai = measure_cli([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inv), "--list"], env)
    listing = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inv), "--list"],
                             capture_output=True, text=True, env=env, check=True).stdout
    js = tmp / f"inv{n}.json"
    js.write_text(listing)
    child = subprocess.run([sys.executable, "-c", CHILD, str(inv), str(js)], capture_output=True, text=True,
                           env=env, cwd=REPO)
    if child.returncode != 0:
        return {"nodes": n, "error": child.stderr[-800:]}
    pure = json.loads(child.stdout)
    cli = measure_cli([DISTRUN, "hostfile", "-i", str(inv)], env)
    row = {"nodes": n, "inventory_yaml_kib": round(inv.stat().st_size / 1024, 1),
           "ansible_inventory_s": round(ai["wall_s"], 2), "ansible_inventory_rss_mib": round(ai["peak_rss_mib"], 1),
           "pure": pure, "distrun_hostfile_s": round(cli["wall_s"], 2), "distrun_hostfile_rc": cli["rc"],
           "distrun_hostfile_rss_mib": round(cli["peak_rss_mib"], 1),
           "hostfile_lines": cli["stdout_lines"] if cli["rc"] == 0 else None, "hostfile_bytes": cli["stdout_bytes"]}
    say(f"scale {n:>5} nodes ({pure['world_size']} ranks): ansible-inventory --list {ai['wall_s']:.2f} s "
        f"{ai['peak_rss_mib']:.0f} MiB | cluster_from_json {pure['cluster_from_json'] * 1000:.1f} ms, build_plan "
        f"{pure['build_plan'] * 1000:.1f} ms, render_hostfile {pure['render_hostfile'] * 1000:.2f} ms, mpirun_argv "
        f"{pure['mpirun_argv'] * 1000:.2f} ms, child peak RSS {pure['peak_rss_mib']:.0f} MiB | distrun hostfile "
        f"{cli['wall_s']:.2f} s rc={cli['rc']} peak RSS {cli['peak_rss_mib']:.0f} MiB")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 100, 1000])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="distrun-bench-scale-") as d:
        rows = [one(n, Path(d)) for n in args.sizes]
    if args.json:
        write_json(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
