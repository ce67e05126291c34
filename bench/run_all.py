#!/usr/bin/env python3
"""Run every benchmark section one after another and write docs/benchmarks.md.

    bench/run [--quick] [--skip cluster] [--reuse DIR] [--out docs/benchmarks.md]

Each section is its own script (bench/cluster.py, bench/nodes.py, bench/partition.py, bench/gdc.py, bench/train.py,
bench/scale.py) writing JSON into bench/results/ (git-ignored); this script prints each figure
next to the comparison it belongs to and renders the Markdown. ``--reuse DIR`` renders sections
whose JSON is already in DIR instead of measuring them again (the document says so).
Sections run one at a time: the machine has 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import header_notes  # noqa: E402
from _common import REPO, machine, median, say  # noqa: E402

SECTIONS = ("cluster", "nodes", "collect", "partition", "gdc", "train", "scale")
RESULTS = REPO / "bench" / "results"
IMAGES = REPO / "docs" / "img"
# distrun train / the same job started by hand, on a 10 s job (mpirun and torchrun alike).
LAUNCH_TARGET_RATIO = 1.10


def launch_ratio(d: dict) -> float:
    return d["distrun_median_s"] / d["hand_median_s"]
RERUN_TARGET = 0.35


def measure(section: str, quick: bool) -> tuple[int, float]:
    py = sys.executable
    out = RESULTS / f"{section}.json"
    if section == "cluster":
        cmd = [py, "bench/cluster.py", "--json", str(out)] + (["--quick"] if quick else [])
    elif section == "collect":
        cmd = [py, "bench/collect.py", "--json", str(out)] + (["--quick"] if quick else [])
    elif section == "train":
        cmd = [py, "bench/train.py", "--json", str(out)] + (["--quick"] if quick else [])
    elif section == "nodes":
        cmd = [py, "bench/nodes.py", "--json", str(out), "--sizes", *(["3", "4"] if quick else ["3", "8", "16"])]
    elif section == "scale":
        cmd = [py, "bench/scale.py", "--json", str(out), "--sizes", *(["3", "1000"] if quick else ["3", "100", "1000", "5000"])]
    elif section == "gdc":
        cmd = [py, "bench/gdc.py", "--json", str(out)] + (["--sizes", "1M", "--seeds", "0"] if quick else [])
    else:
        cmd = [py, "bench/partition.py", "--json", str(out), "--sizes",
               *(["1M", "10M", "--no-recursive"] if quick else ["1M", "10M", "114M"])]
    say(f"== {section}: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO)
    return rc, time.monotonic() - t0


def load(section: str) -> dict | None:
    p = RESULTS / f"{section}.json"
    return json.loads(p.read_text()) if p.exists() else None


def f(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


# ----------------------------------------------------------------------------- rendering

def render_setup(c: dict) -> list[str]:
    s = c.get("setup") or {}
    rows = s.get("rows") or []
    out = ["## `setup.yml` on 3 nodes: first converge, idempotent re-run, connection settings", ""]
    if not rows:
        return out + ["Not measured: the cluster did not come up.", ""]
    first = rows[0]
    out += [f"Cluster: 3 podman containers (Debian 12, systemd, sshd) on one bridge, started in "
            f"{f(c.get('cluster_up_s'))} s. Each run is `distrun setup --inventory <hosts.yml>` (ansible-runner, "
            "ansible-core 2.19), timed from the outside, with a fresh `ANSIBLE_SSH_CONTROL_PATH_DIR` so no run "
            "reuses ssh masters left by the run before. Variants change one setting through the environment.", "",
            "| run | setting | wall s | vs first converge | vs default re-run | changed | rc |",
            "|---|---|---:|---:|---:|---:|---:|"]
    base = s.get("rerun_default_s")
    for r in rows:
        env = ", ".join(f"`{k}={v}`" for k, v in (r.get("env") or {}).items() if k != "PYTHONPATH") or "ansible.cfg"
        if "mitogen" in r["label"]:
            env = "`ANSIBLE_STRATEGY=mitogen_linear`"
        w = r.get("wall_s")
        vs1 = f"{100 * w / first['wall_s']:.0f}%" if w and first.get("wall_s") and r is not first else ""
        vsb = f"{w / base:.2f}x" if w and base and r is not first else ""
        out.append(f"| {r['label']} | {env} | {f(w)} | {vs1} | {vsb} | {r.get('changed') if r.get('changed') is not None else 'n/a'} | {r.get('rc')} |")
    out.append("")
    v = rerun_verdict(s)
    if v:
        out.append(f"**Target** (re-run at most {RERUN_TARGET:.0%} of the first converge, changed=0): the re-run "
                   f"right after the converge took {f(v['wall'])} s = {v['share']:.0%} of {f(first['wall_s'])} s with "
                   f"changed={v['changed']} — **{'met' if v['met'] else 'not met'}**.")
        for r in v["later"]:
            if r.get("changed"):
                out.append(f"Finding: the later default re-run ({r['label']}, after the launch benchmarks' train runs) "
                           f"reported changed={r['changed']}: with `distrun_shared_fs_mode: sync`, setup's "
                           "shared_fs role rsyncs the head's shared folder to the other nodes, and the train runs "
                           "left new run records under `runs/` there. Not an idempotence bug in the roles' own "
                           "state, but `distrun setup` after training is not changed=0 in sync mode (see the report).")
    d = [r["wall_s"] for r in rows[1:] if r["label"].startswith("re-run: default") and r.get("wall_s")]
    if len(d) > 1:
        out.append(f"The same default re-run took {' s and '.join(f(x) for x in d)} s at different times of this run "
                   "(the machine's load average is in the header); read differences between variants against that spread.")
        out.append("")
    out += ["Notes on the variants:",
            "- Pipelining and ControlPersist are on in ansible.cfg; the rows turning them off show what each "
            "saves on 3 nodes (within one run: every run starts with no ssh master).",
            "- Fact caching: ansible-runner sets `ANSIBLE_CACHE_PLUGIN_CONNECTION` to each run's own artifact "
            "folder, overriding the environment, so a cache cannot carry facts from one `distrun setup` to the "
            "next without a runner change; `ANSIBLE_GATHERING=smart` still gathers once per run instead of once "
            "per play (setup.yml imports 5 playbooks).",
            "- mitogen: PyPI's latest mitogen installs next to ansible-core 2.19 (its loader checks only a "
            "minimum Ansible version) and the row above is a real re-run of setup.yml through "
            "`mitogen_linear` against the converged nodes. It is measured, not adopted: the first converge, "
            "become to the training user and the molecule/cluster suites have not been run under it.", ""]
    for r in rows:
        if r.get("error") and r is not first:
            out.append(f"- {r['label']} failed: `{r['error'][:400].replace('|', '/')}`")
        if r.get("note"):
            out.append(f"- {r['label']}: {r['note']}")
    if first.get("error"):
        out.append(f"- first converge failed: `{first['error'][-400:]}`")
    out.append("")
    return out


def rerun_verdict(s: dict) -> dict | None:
    rows = [r for r in (s.get("rows") or [])[1:] if r["label"].startswith("re-run: default") and r.get("wall_s")]
    first = (s.get("rows") or [{}])[0]
    if not rows or not first.get("wall_s"):
        return None
    r = rows[0]
    share = r["wall_s"] / first["wall_s"]
    return {"wall": r["wall_s"], "share": share, "changed": r.get("changed"), "later": rows[1:],
            "met": share <= RERUN_TARGET and r.get("changed") == 0}


def render_launch(c: dict) -> list[str]:
    L = c.get("launch")
    out = ["## Launch overhead: `distrun train --script` vs `mpirun` by hand (3 nodes, 3 ranks, 10 s job)", ""]
    if not L or not L.get("warm"):
        err = (L or {}).get("cold", {}).get("error", "setup failed, nothing launched")
        return out + [f"Not measured: `{err[-400:]}`", ""]
    out += ["The program: an mpi4py script (barrier, `time.sleep(10)`, barrier, print). distrun: "
            "`distrun train --inventory <hosts.yml> --script sleep10.py` timed from the outside (preflight, "
            "stage, launch, follow, collect). By hand: `ssh root@node1 \"su - distrun -c '/usr/bin/mpirun -np 3 "
            "--hostfile <run dir>/hostfile /opt/distrun/venv/bin/python <run dir>/sleep10.py'\"` with the "
            "hostfile and script distrun staged; runs alternate (hand, distrun).", "",
            "| what | runs | wall s (each) | median s |", "|---|---:|---|---:|"]
    ok = lambda rows: [r["wall_s"] for r in rows if r.get("rc") == 0]  # noqa: E731
    hw = ok(L["hand"])
    dw = ok(L["warm"])
    mp = [r["mpirun_s"] for r in L["hand"] if r.get("mpirun_s") is not None]
    out.append(f"| by hand: ssh + su + mpirun | {len(hw)} | {', '.join(f(x, 2) for x in hw)} | {f(L['hand_median_s'], 2)} |")
    if mp:
        out.append(f"| of which mpirun itself (timed on the head) | {len(mp)} | {', '.join(f(x, 2) for x in mp)} | {f(sorted(mp)[len(mp) // 2], 2)} |")
    out.append(f"| `distrun train --script` | {len(dw)} | {', '.join(f(x, 2) for x in dw)} | {f(L['distrun_median_s'], 2)} |")
    out.append(f"| `distrun train --script`, first run on fresh nodes | 1 | {f(L['cold']['wall_s'], 2)} | |")
    sk = L.get("skip_preflight") or {}
    if sk.get("wall_s") is None:
        sk = {}
    out.append(f"| `distrun train --script --skip-preflight` | 1 | {f(sk.get('wall_s'), 2)} | |")
    out.append(f"| plain `ssh root@node1 true` (connection cost) | 1 | {f(L.get('ssh_true_s'), 2)} | |")
    fl = L.get("ansible_floor") or {}
    for label, key in (("`ansible-playbook --version` here (interpreter and Ansible's imports)", "version_s"),
                       ("an empty play through ansible-runner here: to its first event", "empty_first_event_s"),
                       ("the same, started as `distrun` starts it (distrun-ansible-playbook): to its first event",
                        "distrun_first_event_s"),
                       ("the same empty play: to its end", "empty_total_s")):
        xs = fl.get(key) or []
        if xs:
            out.append(f"| {label} | {len(xs)} | {', '.join(f(x, 2) for x in xs)} | {f(median(xs), 2)} |")
    out.append("")
    gap = L.get("gap_s")
    if gap is not None:
        ratio = launch_ratio(L)
        out.append(f"**Target** (distrun / by hand ≤ {LAUNCH_TARGET_RATIO:.2f} on a 10 s job): distrun adds "
                   f"**{gap:.1f} s** over the hand-started run, ratio **{ratio:.2f}** — "
                   f"**{'met' if ratio <= LAUNCH_TARGET_RATIO else 'not met'}**.")
        first = fl.get("empty_first_event_s") or []
        if first:
            budget = (LAUNCH_TARGET_RATIO - 1) * L["hand_median_s"]
            out.append(f"The target allows {budget:.2f} s over the hand-started run; before its first task, any "
                       f"ansible-playbook run through ansible-runner takes {median(first):.2f} s here (an "
                       f"empty play; {median(fl.get('distrun_first_event_s') or first):.2f} s as distrun starts "
                       "it), and run.yml, which also loads the inventory, the preflight and job roles and "
                       "their filter plugins, more. The rest of the budget is for distrun's own start, the "
                       "preflight's probe and judge, staging, the launch and noticing the end, less what the hand "
                       "run pays for its ssh login.")
        out.append("")
    if bench_module("cluster").plot(c, IMAGES / "launch-overhead.png"):
        out += ["![Launch overhead per phase, mpirun and torchrun, against the runs started by hand]"
                "(img/launch-overhead.png)", ""]
    else:
        say("launch: no plot (matplotlib missing: pip install -e '.[bench]')")
    cidr = L["cold"].get("cidr")
    out += ["distrun's own command line differs from the hand one only in flags that cost no time: `--prefix`, "
            "`--map-by slot`, `--output-filename <run dir>/ranks`" + (f", `--mca btl_tcp_if_include {cidr}` and "
            "`oob_tcp_if_include`" if cidr else "") + ", `-x` of the run's variables and the rank wrapper "
            "`rank-env.sh` in front of the program.", ""]
    # Phase breakdown of the last warm run.
    last = next((r for r in reversed(L["warm"]) if r.get("phases")), None)
    if last:
        out += [f"Where the time goes in one warm `distrun train` run ({f(last['wall_s'], 2)} s): the runner's "
                "own steps from the run record's `timings.json`, and inside `run.yml` (one play) each step from "
                "ansible-runner's job events (from the event that publishes the step to the last one before the next):", "",
                "| phase | s |", "|---|---:|"]
        for k, v in last["phases"].items():
            name = k.strip()
            out.append(f"| {'&nbsp;&nbsp;' + name if k.startswith('  ') else name} | {v:.2f} |")
        out.append("")
        ph = last["phases"]
        fol = ph.get("follow (ranks run)")
        mpm = sorted(mp)[len(mp) // 2] if mp else None
        ours = sum(v for k, v in ph.items() if not k.startswith("  ") and not k.startswith("follow"))
        if fol is not None and mpm is not None:
            out += [f"Reading: besides following the ranks ({fol:.1f} s, against mpirun's own {f(mpm, 2)} s), "
                    f"this run spent {ours:.1f} s in distrun's steps; `run.yml` (one ansible-playbook process "
                    f"for preflight and stage) took {ph.get('run.yml (preflight, stage)', 0):.1f} s "
                    "of it. It gathers no facts (the plan comes from the cached ones; the probe reports the "
                    "addresses it is checked against); a first attempt is checked and staged in one raw command "
                    "per node (the probe unpacks the run's files, which reach the nodes ahead of the play, after "
                    "its own checks), and one judge task for the play comes before anything starts (a refused "
                    "run's staged folders are removed); the launchers start over the ssh connection per node that "
                    "distrun opens first and that the playbook, the followers and collect share; collect is one tar stream per "
                    "node.", ""]
    return out


def render_torchrun(c: dict) -> list[str]:
    T = c.get("torchrun")
    if T is None:
        return []
    out = ["### torchrun: `distrun train --launcher torchrun --script` vs torchrun by hand", ""]
    if T.get("gap_s") is None:
        err = T.get("error") or (T.get("cold") or {}).get("error") or next(
            (r.get("error") for r in T.get("hand", []) + T.get("warm", []) if r.get("error")), "no successful pair")
        return out + [f"Not measured: `{str(err)[-500:]}`", ""]
    ok = lambda rows: [r["wall_s"] for r in rows if r.get("rc") == 0]  # noqa: E731
    out += ["Program: torch.distributed (gloo) init, barrier, sleep 10 s, barrier. By hand: three ssh sessions "
            "started at once, one per node, each `su - distrun -c 'GLOO_SOCKET_IFNAME=<its interface> torchrun --nnodes=3 --nproc-per-node=1 "
            "--rdzv-backend=c10d --rdzv-endpoint=NODE1_ADDRESS:PORT --rdzv-conf=is_host=1 (0 on the other two) --local-addr=NODE_ADDRESS ... sleep_torch.py'`; wall time until all three exit.", "",
            "| what | runs | wall s (each) | median s |", "|---|---:|---|---:|",
            f"| torchrun by hand (3 ssh) | {len(ok(T['hand']))} | {', '.join(f(x, 2) for x in ok(T['hand']))} | {f(T['hand_median_s'], 2)} |",
            f"| `distrun train --launcher torchrun --script` | {len(ok(T['warm']))} | {', '.join(f(x, 2) for x in ok(T['warm']))} | {f(T['distrun_median_s'], 2)} |",
            f"| same, first torchrun run | 1 | {f(T['cold']['wall_s'], 2)} | |", "",
            f"Gap: **+{T['gap_s']:.1f} s**, ratio **{launch_ratio(T):.2f}** (target: ≤ {LAUNCH_TARGET_RATIO:.2f}).", ""]
    last = next((r for r in reversed(T["warm"]) if r.get("phases")), None)
    if last:
        out.append("Phases of the last run: " + ", ".join(f"{k} {v:.2f} s" for k, v in last["phases"].items()) + ".")
        out.append("")
    return out


def render_failures(c: dict) -> list[str]:
    F = c.get("failures")
    out = ["## Failure latency: a stopped node, a node killed mid-run (3 nodes)", ""]
    if not F or F.get("error"):
        return out + [f"Not measured in this run{': ' + F['error'] if F else ''}.", ""]
    out += ["The cluster tests assert that both failures are named and end the run; how fast depends on the",
            "machine's load, so the figures live here, next to a plain `ssh true` and the load measured at the",
            "same time.", "",
            "| what | measured | same time: `ssh true` | load (1 min) |", "|---|---:|---:|---:|",
            f"| `distrun check` names a stopped node2 ({F.get('check_node2_state')}) | {F['check_stopped_node_s']} s "
            f"| {F['ssh_true_s']} s | {F['load_1min']} |",
            f"| `distrun train` ends after node3 is killed (rc {F.get('train_rc')}) | {F.get('killed_node_end_s')} s "
            f"| {F['ssh_true_s']} s | {F['load_1min']} |", ""]
    return out


def bench_module(name: str):  # noqa: ANN201
    """A section's script as a module (under its own name: bench/partition.py is not workloads/partition.py)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def with_plot(name: str, data: dict | None, image: str) -> list[str]:
    """The section's Markdown, with its PNG next to the tables when matplotlib is installed."""
    mod = bench_module(name)
    rel = None
    if data and mod.plot(data, IMAGES / image):
        rel = f"img/{image}"
    elif data:
        say(f"{name}: no plot (matplotlib missing: pip install -e '.[bench]')")
    return mod.render(data, rel)


def render_cluster(c: dict) -> list[str]:
    """Every section the cluster benchmark (bench/cluster.py) measures, in the page's order."""
    return render_setup(c) + render_launch(c) + render_torchrun(c) + render_long_runs(c) + render_failures(c)


def render_partition(_quick: bool) -> list[str]:
    return with_plot("partition", load("partition"), "partition-time-memory.png")


def render_gdc() -> list[str]:
    return bench_module("gdc").render(load("gdc"))


def render_collect() -> list[str]:
    return bench_module("collect").render(load("collect"))


def render_long_runs(c: dict) -> list[str]:
    L = c.get("long_runs")
    out = ["## Long runs: detach, read from the nodes, busy hosts (3 nodes)", ""]
    if not L or L.get("error"):
        return out + [f"Not measured in this run{': ' + L['error'] if L else ''}.", ""]
    out += ["A detached run of an mpi4py program; each figure is the wall time of one CLI call. The cluster",
            "tests assert the refusal of a second run on busy hosts; its time lives here.", "",
            "| what | wall | load (1 min) |", "|---|---:|---:|",
            f"| `distrun train --detach` returns, every rank started (rc {L['detach_rc']}) | {L['detach_s']} s | {L['load_1min']} |",
            f"| `distrun status RUN --json` reads it from the nodes ({L.get('status_state')}) | {L.get('status_s')} s | |",
            f"| `distrun runs` with that record checked live | {L.get('runs_s')} s | |",
            f"| a second `distrun train` on the busy hosts is refused (rc {L.get('busy_rc')}, names the run: "
            f"{L.get('busy_named_run')}) | {L.get('busy_refused_s')} s | |",
            f"| `distrun stop RUN` (rc {L.get('stop_rc')}) | {L.get('stop_s')} s | |", ""]
    return out


def render_train(t: dict | None) -> list[str]:
    return with_plot("train", t, "strong-scaling.png")


def render_scale(s: dict | None) -> list[str]:
    out = ["## Scale on paper: generated inventories up to 1000+ nodes", ""]
    if not s:
        return out + ["Not measured in this run.", ""]
    out += ["Generated YAML inventory: group `head` (1 host) and `workers` (N hosts, `ansible_host` and "
            "`slots: 8` each). Pure steps in a fresh Python process, median of 5 (`cluster_from_json`, "
            "`build_plan` for every slot, `plan.render_hostfile`, `launchers.mpirun_argv`); `ansible-inventory "
            "--list` and the real `distrun hostfile -i <yaml>` (which runs ansible-inventory itself) timed as "
            "processes, with the peak RSS of the largest process.", "",
            "| nodes | ranks | inventory KiB | ansible-inventory --list s | its peak RSS MiB | cluster_from_json ms | "
            "build_plan ms | render_hostfile ms | mpirun_argv ms | runner process peak RSS MiB | "
            "`distrun hostfile` s | its peak RSS MiB | hostfile lines |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in s["rows"]:
        p = r.get("pure")
        if not p:
            out.append(f"| {r['nodes']} | error: {r.get('error', '')[:200]} |")
            continue
        out.append(f"| {r['nodes']:,} | {p['world_size']:,} | {r['inventory_yaml_kib']} | {f(r['ansible_inventory_s'], 2)} | "
                   f"{f(r['ansible_inventory_rss_mib'], 0)} | {p['cluster_from_json'] * 1000:.2f} | {p['build_plan'] * 1000:.2f} | "
                   f"{p['render_hostfile'] * 1000:.2f} | {p['mpirun_argv'] * 1000:.2f} | {f(p['peak_rss_mib'], 0)} | "
                   f"{f(r['distrun_hostfile_s'], 2)} | {f(r['distrun_hostfile_rss_mib'], 0)} | {r.get('hostfile_lines')} |")
    ok_rows = [r for r in s["rows"] if r.get("pure")]
    if len(ok_rows) >= 2:
        a, b = ok_rows[-2], ok_rows[-1]
        import math
        ta, tb = a["pure"]["cluster_from_json"], b["pure"]["cluster_from_json"]
        if ta > 0 and tb > 0:
            k = math.log(tb / ta) / math.log(b["nodes"] / a["nodes"])
            out += ["", f"`cluster_from_json` grows as about N^{k:.1f} between {a['nodes']:,} and {b['nodes']:,} nodes "
                    f"({ta * 1000:.1f} → {tb * 1000:.1f} ms; linear is N^1.0). Group membership is kept in dicts and sets "
                    "(it was tested in lists, N^1.8: 9.8 → 191 ms before); what remains is one Node per host. "
                    "`ansible-inventory --list` dominates every verb's start-up at this size."]
    out += ["", SCALE_NOTE, ""]
    return out


SCALE_NOTE = """\
What limits a real run at 1000 nodes (not measured: one machine cannot host 1000 sshd's; this is
the arithmetic from the measurements above and the tools' documented behaviour):

- **Planning is not the limit.** The runner's own steps stay in milliseconds and tens of MiB at
  1000 nodes (table above); `ansible-inventory --list` dominates every verb's start-up.
- **`distrun setup` is bounded by Ansible forks.** ansible.cfg sets `forks = 20`: with the
  linear strategy each task runs on at most 20 hosts at a time, so a task costs
  ceil(1000/20) = 50 rounds of one ssh round trip plus module run. The 3-node re-run above
  spends its time in per-task round trips (compare the forks=1 and pipelining-off rows), so at
  1000 nodes expect roughly 50x the 3-node per-task time at forks=20; raising forks to 100-200
  cuts the rounds to 10-5 but costs one controller process (about 40-60 MiB each) per fork and
  the controller's CPU, which then becomes the limit. Pipelining and ControlPersist matter more
  at that size, not less (each saves round trips per task per host).
- **mpirun's launch is a tree, but ssh is the fan-out.** Open MPI 4.1's rsh launcher starts
  orted daemons over ssh using a tree spawn (`plm_rsh_no_tree_spawn` off by default), and
  `--mca plm_rsh_num_concurrent` (default 128) caps concurrent ssh sessions per launching
  daemon: 1000 nodes take a few generations of the tree, each costing an ssh handshake
  (~0.1-0.3 s, the `ssh true` row above). Every node must accept ssh from the nodes that launch
  it (tree spawn means not only from the head), which the ssh_mesh role provides. sshd's
  `MaxStartups` (default 10:30:100) on the head throttles bursts of incoming connections, which
  matters for the collect/stop playbooks and for torchrun-style per-node starts driven from one
  controller.
- **The mpirun command line itself stays short**: `--hostfile` carries the 1000 hosts (the
  hostfile is ~20 KB), not argv; its size is in the table (argv_bytes is in the JSON).
- **File transfer**: staging sends the run files from the controller to the head once and the
  shared folder carries them; with `distrun_shared_fs_mode: sync` the head rsyncs to every node,
  which is 1000 rsync-over-ssh sessions per run — NFS (production) or sshfs avoid that.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer variants and repeats, small sizes (< 8 min)")
    ap.add_argument("--skip", nargs="*", default=[], choices=SECTIONS)
    ap.add_argument("--reuse", type=Path, default=None, help="render sections whose JSON is already in this folder")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    ap.add_argument("--render-only", action="store_true",
                    help="re-render --out from bench/results of the last run, keeping its header line")
    ap.add_argument("--note", default="", help="with --render-only: a sentence added to the header")
    ap.add_argument("--only", nargs="+", choices=SPLICEABLE, default=None,
                    help="measure only these sections and replace them (and their summary rows) in --out, "
                         "keeping every other section as it is")
    args = ap.parse_args(argv)
    if args.render_only:
        return render_only(args.out, args.quick, args.note)
    if args.only:
        return measure_and_splice(args.out, args.only, args.quick, args.reuse)
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    started = time.monotonic()
    timings: dict[str, str] = {}
    reused: list[str] = []
    for section in SECTIONS:
        if section in args.skip:
            timings[section] = "skipped"
            continue
        src = (args.reuse / f"{section}.json") if args.reuse else None
        if src is not None and src.exists():
            if src.resolve() != (RESULTS / src.name).resolve():
                shutil.copyfile(src, RESULTS / src.name)
            reused.append(section)
            timings[section] = "reused"
            continue
        (RESULTS / f"{section}.json").unlink(missing_ok=True)
        rc, secs = measure(section, args.quick)
        timings[section] = f"{secs:.0f} s" + (f" (rc {rc})" if rc else "")
    total = time.monotonic() - started

    cluster = load("cluster") if "cluster" not in args.skip else None
    lines = ["# Benchmarks", "",
             f"Generated by `bench/run{' --quick' if args.quick else ''}` on {info['date_utc']}: {info['os']}, kernel "
             f"{info['kernel']}, {info['cpus']} cores (1-min load average "
             f"{info['load_1min_at_start']} at start), {info['mem_gib']} GiB RAM, Python {info['python']}, no GPU. "
             f"Section times: {', '.join(f'{k} {v}' for k, v in timings.items())}; total {total / 60:.1f} min."
             + (f" Sections rendered from earlier JSON of the same session (`--reuse`): {', '.join(reused)}." if reused else ""),
             "", "Numbers are single measurements on a 2-core VM under the load stated above; differences under ~10% are noise. "
             "Regenerate with `bench/run` (full, about 30 min) or `bench/run --quick` (< 8 min); each section "
             "also runs alone (`bench/cluster.py`, `bench/collect.py`, `bench/partition.py`, `bench/gdc.py`, `bench/train.py`, "
             "`bench/scale.py`).", ""]
    lines += render_summary(cluster, load("train"), load("scale"))
    if cluster is not None:
        lines += render_cluster(cluster)
    else:
        lines += ["## Cluster sections", "", "Skipped in this run (`--skip cluster`).", ""]
    lines += render_collect() + render_partition(args.quick) + render_gdc() + render_train(load("train"))
    lines += bench_module("nodes_report").render(load("nodes")) + render_scale(load("scale"))
    lines += [NOT_MEASURED]
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    say(f"wrote {args.out} ({total / 60:.1f} min)")
    say("\n".join(render_summary(cluster, load("train"), load("scale"))))
    return 0


# Sections that can be re-measured alone and spliced into an existing document: heading prefixes
# of the blocks they replace, and the summary rows they own.
SPLICEABLE = ("cluster", "nodes", "collect", "partition", "gdc", "train")
SPLICE_HEADINGS = {"partition": ("## Partition",), "nodes": ("## Scale on real nodes",), "gdc": ("## GDC",), "collect": ("## Collect",),
                   "train": ("## Strong scaling", "## Training: epoch time"),
                   "cluster": ("## `setup.yml`", "## Launch overhead", "## Long runs", "## Failure latency")}
SPLICE_ROWS = {"nodes": ("| check, first run", "| check again", "| check (median", "| launch overhead (train"),
               "train": ("| gcn_ddp epoch", "| gcn_torch epoch", "| gcn_jittor epoch"), "collect": ("| collect with",),
               "partition": ("| partition 114M", "| reuse an existing partition"), "gdc": ("| GDC diffusion",),
               "cluster": ("| setup.yml", "| distrun train --script", "| distrun train --launcher torchrun")}


def _blocks(text: str) -> tuple[list[str], list[list[str]]]:
    """(preamble lines, blocks): each block starts at a '## ' heading."""
    pre: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            pre.append(line)
    return pre, blocks


def splice(text: str, rendered: dict[str, list[str]], summary_rows: list[str], note: str,
           rendered_again_at: str | None = None) -> str:
    """The document with the sections in ``rendered`` (and their summary rows) replaced, and the
    header's notes merged (bench/header_notes.py): ``note`` replaces earlier notes on the same
    sections; with ``rendered_again_at`` (nothing measured) the earlier measurement's note stays."""
    pre, blocks = _blocks(text)
    for section, lines in rendered.items():
        # A section may render several '## ' blocks (cluster): the first old one's place takes them all.
        old = [i for i, b in enumerate(blocks) if b[0].startswith(SPLICE_HEADINGS[section])]
        if not old:  # a new section: after the partition section (nodes: before the scale on paper), else before the notes
            after = None if section == "nodes" else next(
                (i for i, b in enumerate(blocks) if b[0].startswith("## Partition")), None)
            at = after + 1 if after is not None else next(
                (i for i, b in enumerate(blocks) if b[0].startswith(("## Scale on paper", "## Not measured"))), len(blocks))
            blocks.insert(at, lines)
        else:
            for i in reversed(old[1:]):
                del blocks[i]
            blocks[old[0]] = lines
    # Only the summary rows of the sections measured now are replaced; the others stay.
    owned = tuple(prefix for section in rendered for prefix in SPLICE_ROWS[section])
    summary_rows = [row for row in summary_rows if row.startswith(owned)]
    for b in blocks:
        if b[0].startswith("## Summary"):
            kept = [ln for ln in b if not ln.startswith(owned)]
            last_row = max(i for i, ln in enumerate(kept) if ln.startswith("|"))
            b[:] = kept[: last_row + 1] + summary_rows + kept[last_row + 1 :]
        if b[0].startswith("## Not measured"):
            b[:] = NOT_MEASURED.rstrip().splitlines() + [""]
    # Notes of earlier splices on other sections stay (they date those sections).
    pre = [header_notes.merge(ln, list(rendered), note, rendered_again_at) if ln.startswith("Generated by") else ln
           for ln in pre]
    return "\n".join(pre + [ln for b in blocks for ln in b]).rstrip() + "\n"


def measure_and_splice(out: Path, sections: list[str], quick: bool, reuse: Path | None) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    timings = []
    for section in sections:
        src = (reuse / f"{section}.json") if reuse else None
        if src is not None and src.exists():
            if src.resolve() != (RESULTS / src.name).resolve():
                shutil.copyfile(src, RESULTS / src.name)
            timings.append(f"{section} reused")
            continue
        (RESULTS / f"{section}.json").unlink(missing_ok=True)
        rc, secs = measure(section, quick)
        timings.append(f"{section} {secs:.0f} s" + (f" (rc {rc})" if rc else ""))
    rendered = {"partition": lambda: render_partition(quick), "gdc": render_gdc, "collect": render_collect,
                "train": lambda: render_train(load("train")), "cluster": lambda: render_cluster(load("cluster") or {}),
                "nodes": lambda: bench_module("nodes_report").render(load("nodes"))}
    parts = {s: rendered[s]() for s in sections}
    reused_all = all(t.endswith(" reused") for t in timings)
    how = "rendered from earlier JSON" if reused_all else "re-measured"
    command = (f"bench/run --only {' '.join(sections)}{' --quick' if quick else ''}"
               f"{f' --reuse {reuse}' if reuse else ''}")
    note = header_notes.note(sections, how, command, info["date_utc"], info["load_1min_at_start"], timings)
    text = out.read_text() if out.exists() else "# Benchmarks\n\nGenerated by `bench/run`.\n\n## Summary\n\n| figure | measured | compared with | target | verdict |\n|---|---:|---|---|---|\n\n## Not measured, and why\n"
    rows = [ln for ln in render_summary(load("cluster"), load("train"), load("scale")) if ln.startswith("| ")]
    again = time.strftime("%H:%M UTC", time.gmtime()) if reused_all else None
    out.write_text(splice(text, parts, rows, note, again))
    say(f"spliced {', '.join(sections)} into {out}")
    return 0


def render_only(out: Path, quick: bool, note: str = "") -> int:
    old = out.read_text().splitlines() if out.exists() else []
    header = next((ln for ln in old if ln.startswith("Generated by")), "Generated by `bench/run` (header lost).")
    header = header.split(" Re-rendered from")[0]
    header += (f" Re-rendered from that run's JSON (`bench/run --render-only`) on "
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}." + (f" {note}" if note else ""))
    cluster = load("cluster")
    lines = ["# Benchmarks", "", header, "", "Numbers are single measurements on a 2-core VM under the load stated above; differences "
             "under ~10% are noise. Regenerate with `bench/run` (full, about 30 min) or `bench/run --quick` (< 8 min); "
             "each section also runs alone (`bench/cluster.py`, `bench/collect.py`, `bench/partition.py`, `bench/gdc.py`, "
             "`bench/train.py`, `bench/nodes.py`, `bench/scale.py`).", ""]
    lines += render_summary(cluster, load("train"), load("scale"))
    if cluster is not None:
        lines += render_cluster(cluster)
    lines += render_partition(quick) + render_gdc() + render_train(load("train"))
    lines += bench_module("nodes_report").render(load("nodes")) + render_scale(load("scale"))
    lines += [GPU_SECTION, NOT_MEASURED]
    out.write_text("\n".join(lines).rstrip() + "\n")
    say(f"re-rendered {out}")
    return 0


def workload_rows(t: dict | None) -> list[str]:
    """The summary rows of the workload sections (strong scaling, partition, reuse, GDC)."""
    out: list[str] = []
    if t:
        shapes = t.get("shapes") or {"": None}
        for shape, g in shapes.items():
            for w in sorted({r["workload"] for r in t["rows"]}):
                out.append(scaling_row(t, w, shape, g))
    part = load("partition")
    if part:
        big = next((c for c in part["cells"] if c.get("ok") and c["size"] == "114M" and c["parts"] == 2
                    and c["method"] == "kway"), None)
        if big:
            ok = big["partition_s"] <= 10 and big["peak_rss_gib"] <= 4
            out.append(f"| partition 114M edges, 2 parts | {big['partition_s']:.1f} s, {big['peak_rss_gib']:.2f} GiB | "
                       f"before: 12.4 s, 7.51 GiB | ≤ 10 s, ≤ 4 GiB | {'met' if ok else 'not met'} (load {big['load']:.1f}) |")
        for r in part.get("reuse") or []:
            if r.get("ok"):
                out.append(f"| reuse an existing partition, {r['label']} | {r['median_s']:.3f} s | — | ≤ 0.2 s | "
                           f"{'met' if r['median_s'] <= 0.2 else 'not met'} |")
    out += bench_module("collect").summary_row(load("collect"))
    g = load("gdc")
    if g:
        for r in g["sizes"]:
            if r.get("ok"):
                out.append(f"| GDC diffusion, {r['edges']:,} edges | {r['seconds']:.1f} s, "
                           f"{max(r['peak_rss_gib'], r['worker_peak_rss_gib']):.2f} GiB | — | minutes, bounded memory | "
                           f"(load {r['load']:.1f}) |")
    return out


def scaling_row(t: dict, w: str, shape: str, g: dict | None) -> str:
    """A workload's summary row on one graph shape (``g`` None: a result from before shapes)."""
    rows = {r["label"]: r for r in t["rows"] if r["workload"] == w and r.get("shape", "") == shape}
    one, two = rows.get("1 rank x 1 thread", {}), rows.get("2 ranks x 1 thread", {})
    sp = two.get("speedup")
    on = f", {shape} graph ({g['nodes']:,} nodes, {g['features']} features, hidden {g['hidden']})" if g else ""
    return (f"| {w} epoch{on}, 1 rank x 1 thread / 2 ranks x 1 thread | {f(one.get('epoch_s'), 3)} / "
            f"{f(two.get('epoch_s'), 3)} s | speedup {f(sp, 2)} | ≥ 1.7 | "
            f"{'met' if sp and sp >= 1.7 else 'not met'} (load {f(two.get('load_1min'))}) |")


def render_summary(c: dict | None, t: dict | None, s: dict | None) -> list[str]:
    out = ["## Summary", "", "| figure | measured | compared with | target | verdict |", "|---|---:|---|---|---|"]
    if c and (c.get("setup") or {}).get("rows"):
        st = c["setup"]
        first = st["rows"][0]
        out.append(f"| setup.yml first converge, 3 nodes | {f(first['wall_s'])} s, changed={first.get('changed')} | — | — | rc {first['rc']} |")
        v = rerun_verdict(st)
        if v:
            out.append(f"| setup.yml re-run right after it | {f(v['wall'])} s, changed={v['changed']} | "
                       f"{v['share']:.0%} of first converge | ≤ 35%, changed=0 | {'met' if v['met'] else 'not met'} |")
            for r in v["later"]:
                out.append(f"| setup.yml default re-run after the launch benchmarks | {f(r['wall_s'])} s, changed={r.get('changed')} | "
                           f"{100 * r['wall_s'] / first['wall_s']:.0f}% | changed=0 | "
                           f"{'met' if r.get('changed') == 0 else 'changed: sync copies new run records'} |")
    if c and (c.get("launch") or {}).get("gap_s") is not None:
        L = c["launch"]
        out.append(f"| distrun train --script, 10 s mpi4py job | {f(L['distrun_median_s'], 2)} s | by hand "
                   f"{f(L['hand_median_s'], 2)} s: +{L['gap_s']:.1f} s, ratio {launch_ratio(L):.2f} | ≤ {LAUNCH_TARGET_RATIO:.2f} | "
                   f"{'met' if launch_ratio(L) <= LAUNCH_TARGET_RATIO else 'not met'} |")
    out += bench_module("nodes_report").summary_rows(load("nodes"))
    out += workload_rows(t)
    if c and (c.get("torchrun") or {}).get("gap_s") is not None:
        T = c["torchrun"]
        out.append(f"| distrun train --launcher torchrun, 10 s job | {f(T['distrun_median_s'], 2)} s | torchrun by hand "
                   f"{f(T['hand_median_s'], 2)} s: +{T['gap_s']:.1f} s, ratio {launch_ratio(T):.2f} | ≤ {LAUNCH_TARGET_RATIO:.2f} | "
                   f"{'met' if launch_ratio(T) <= LAUNCH_TARGET_RATIO else 'not met'} |")
    if s:
        big = max(s["rows"], key=lambda r: r["nodes"])
        p = big.get("pure") or {}
        if p:
            out.append(f"| plan + hostfile + argv, {big['nodes']:,} nodes | "
                       f"{(p['cluster_from_json'] + p['build_plan'] + p['render_hostfile'] + p['mpirun_argv']) * 1000:.0f} ms, "
                       f"{f(p['peak_rss_mib'], 0)} MiB | `distrun hostfile` {f(big['distrun_hostfile_s'], 2)} s | — | — |")
    out.append("")
    return out


# No bench section measures the GPU: scripts/gpu-check does, on a machine that has one; what it
# printed there is kept here and in docs/benchmarks.md.
GPU_SECTION = """\
## GPU: the torch trainers and the DDP example on CUDA (NCCL)

Run on 2026-11-27 at 11:31 UTC, on a lent machine with one NVIDIA H200 (143771 MiB, driver
580.159.04, 16 cores), Python 3.12.3, torch 2.11.0+cu130 (CUDA 13.0, NCCL 2.28.9), numpy 2.5.2, no
network: `scripts/gpu-check --cora DIR` with Cora copied beside the repository, 98 s in all. It
runs every program under `python -m torch.distributed.run --standalone --nproc-per-node=N` at 1
rank and, with several GPUs, at 2 and at the GPU count: one GPU here, so **1 rank only; 2 and more
ranks over NCCL have not run** (no machine with several GPUs). The checks are the CPU tests': logits,
loss and gradients against the float64 reference (abs < 1e-5, rel < 1e-4), Cora test accuracy ≥
0.795 after 200 epochs, a falling loss of `ddp_minimal.py`; every program reports the device it
computed on (here `cuda:0` in all five, backend `nccl`), and a row whose program ran on the CPU
fails. Epoch time is the training step's mean after the first epoch. The script needs no network,
only this repository and a Python with a CUDA build of torch and numpy (pymetis for partitions of
more than one part, or `--parts DIR`); where torch sees no CUDA GPU it exits 2 with one line saying
so. Its plan, verdicts and table are also unit-tested (`tests/unit/test_gpu_check.py`).

    scripts/gpu-check --cora DIR        # with the Python that holds torch; log in /tmp/gpu-check/log.txt

| configuration | ranks | device | epoch time | checked number | verdict |
|---|---:|---|---:|---|---|
| gcn_torch exact (cora) | 1 | NVIDIA H200 (cuda, nccl) | — | max error abs 9.6e-08, rel 8.0e-06 | pass |
| gcn_ddp exact (cora) | 1 | NVIDIA H200 (cuda, nccl) | — | max error abs 9.6e-08, rel 8.0e-06 | pass |
| gcn_torch accuracy (cora) | 1 | NVIDIA H200 (cuda, nccl) | 5.4 ms | test accuracy 0.822 (>= 0.795) | pass |
| gcn_ddp accuracy (cora) | 1 | NVIDIA H200 (cuda, nccl) | 6.2 ms | test accuracy 0.812 (>= 0.795) | pass |
| ddp_minimal | 1 | NVIDIA H200 (cuda, nccl) | — | loss 0.508 -> 0.282 | pass |
| any of the above | 2, GPUs | — | — | — | not run (one GPU) |
"""

NOT_MEASURED = """\
## Not measured, and why

- **More than 16 nodes, and GPUs beyond one**: one 2-core VM without a GPU; the CLI's verbs are
  measured on up to 16 light nodes (no torch or Jittor on them), 1000 nodes only on paper
  (planning/rendering) above; the GPU rows come from two lent single-GPU machines (an H200, then
  an H100; section above), with no distrun cluster on them.
- **NFS shared folder**: this kernel has no NFS client or server; the test cluster uses
  `distrun_shared_fs_mode: sync` (rsync from the head).
- **torchrun by hand vs `--launcher torchrun`**: only in the full run (`--quick` skips it).
- **The replicated DDP example (`ddp` workload) epoch times**: every rank computes the whole
  graph, so it cannot scale with ranks; the strong-scaling section measures the partitioned
  workloads (`gcn-torch`, `gcn`) instead. Jittor compiles its core once per machine (about 6
  minutes) before the first `gcn` row.
- **Cold vs warm ssh masters across runs**: every ansible run here starts with a fresh
  ControlPath directory, so ControlPersist only helps within one run.
"""


if __name__ == "__main__":
    sys.exit(main())
