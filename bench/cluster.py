#!/usr/bin/env python3
"""Cluster benchmarks on a 3-node podman cluster: setup.yml converge/re-run and launch overhead.

    .venv/bin/python bench/cluster.py [--quick] [--json OUT]

Starts its own cluster ``distrun-bench`` (inventory: a temporary copy of inventory/test/group_vars
plus the generated hosts.yml), always tears it down (try/finally). Every ansible run gets a fresh
ControlPath directory, so no run profits from ssh masters a previous run left open.

Measured:
  setup     first converge, then re-runs: default ansible.cfg (pipelining on, ControlPersist 60s,
            forks 20), and in the full run: pipelining off, ControlPersist off, forks=1, smart
            gathering (facts once per run), the mitogen strategy when it installs.
  launch    `distrun train --script sleep10.py` (an mpi4py program: barrier, sleep 10 s, barrier)
            vs the same program by hand: ssh root@head, su - distrun, /usr/bin/mpirun -np 3
            --hostfile <run dir>/hostfile /opt/distrun/venv/bin/python <run dir>/sleep10.py.
            Phases of distrun's run come from ansible-runner's job events (artifacts).
  long runs `distrun train --detach` until every rank started, `distrun status --json` and
            `distrun runs` reading a detached run from its nodes, and a second `distrun train` on
            the busy hosts until it is refused (the tests only assert the refusal).
  failures  how long `distrun check` takes to name a stopped node, and how long `distrun train`
            takes to end a run after a node is killed mid-run, next to a plain ssh round trip and
            the machine's load average measured at the same time (the tests only assert that
            both happen; these latencies depend on the load).
This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DISTRUN, REPO, CliHome, median, run, say, write_json  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.harness import podcluster  # noqa: E402

NAME = "distrun-bench"
RECAP = re.compile(r"PLAY RECAP (\S+): hosts=(\d+) changed=(\d+) failed=(\d+) unreachable=(\d+) rc=(-?\d+)")
RUN_ID = re.compile(r"run (\S+): record in (\S+)")

SLEEP_PROGRAM = '''\
"""mpi4py: every rank meets, sleeps 10 s, meets again (the launch-overhead probe)."""
import socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
t0 = time.time()
time.sleep(10)
comm.Barrier()
print(f"rank {comm.Get_rank()}/{comm.Get_size()} on {socket.gethostname()} slept {time.time() - t0:.2f}s", flush=True)
'''


TORCH_PROGRAM = '''\
"""torch.distributed (gloo): every rank meets, sleeps 10 s, meets again (torchrun probe)."""
import socket, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
t0 = time.time()
time.sleep(10)
dist.barrier()
print(f"rank {dist.get_rank()}/{dist.get_world_size()} on {socket.gethostname()} slept {time.time() - t0:.2f}s", flush=True)
dist.barrier()
dist.destroy_process_group()
'''

LONG_PROGRAM = '''\
"""mpi4py: every rank says where it runs, then meets every second for 10 minutes (node-kill probe)."""
import os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"LONG rank={comm.Get_rank()} host={socket.gethostname()}", flush=True)
for _ in range(600):
    comm.Barrier()
    time.sleep(1)
'''


class Bench(CliHome):
    def __init__(self, tmp: Path, quick: bool) -> None:
        super().__init__(tmp)
        self.quick = quick
        self.inv_dir = tmp / "inv"
        self.hosts = self.inv_dir / "hosts.yml"

    # ------------------------------------------------------------------ setup
    def setup(self, label: str, extra: dict | None = None) -> dict:
        proc, wall = run([DISTRUN, "setup", "--inventory", str(self.hosts)], env=self.env(extra), timeout=1800)
        m = RECAP.search(proc.stdout)
        row = {"label": label, "env": extra or {}, "wall_s": round(wall, 1), "rc": proc.returncode,
               "changed": int(m[3]) if m else None, "failed": int(m[4]) if m else None,
               "unreachable": int(m[5]) if m else None}
        if proc.returncode != 0:
            row["error"] = (proc.stdout[-1500:] + proc.stderr[-1500:]).strip()
        say(f"setup {label:<38} {wall:7.1f} s  changed={row['changed']} rc={proc.returncode}")
        return row

    def setup_suite(self) -> dict:
        """First converge and the default re-run(s); the variants come later (setup_variants)."""
        rows = [self.setup("first converge")]
        first = rows[0]
        if first["rc"] != 0:
            say(first.get("error", ""))
            return {"rows": rows}
        rows.append(self.setup("re-run: default (ansible.cfg)"))
        return self.summarise(rows)

    def setup_variants(self, suite: dict) -> dict:
        rows = suite["rows"]
        rows.append(self.setup("re-run: default, again"))
        rows.append(self.setup("re-run: pipelining off", {"ANSIBLE_PIPELINING": "False"}))
        rows.append(self.setup("re-run: ControlPersist off",
                               {"ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ServerAliveInterval=5 -o ServerAliveCountMax=3"}))
        rows.append(self.setup("re-run: forks=1", {"ANSIBLE_FORKS": "1"}))
        # ansible-runner points ANSIBLE_CACHE_PLUGIN_CONNECTION at each run's own artifact
        # folder (it overrides the environment), so "smart" gathers once per run, not once per play.
        rows.append(self.setup("re-run: smart gathering (once per run)", {"ANSIBLE_GATHERING": "smart"}))
        rows.append(self.mitogen())
        return self.summarise(rows)

    @staticmethod
    def summarise(rows: list[dict]) -> dict:
        first = rows[0]
        reruns = [r for r in rows[1:] if r["label"].startswith("re-run: default")]
        base = median([r["wall_s"] for r in reruns])
        return {"rows": rows, "first_s": first["wall_s"], "rerun_default_s": base,
                "rerun_share": round(base / first["wall_s"], 3) if first["wall_s"] else None,
                "rerun_changed": [r["changed"] for r in reruns]}

    def mitogen(self) -> dict:
        target = self.tmp / "mitogen"
        proc, _ = run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), "mitogen"], timeout=300)
        if proc.returncode != 0:
            return {"label": "re-run: mitogen strategy", "rc": proc.returncode, "wall_s": None, "changed": None,
                    "error": "pip install mitogen failed: " + proc.stderr.strip()[-300:]}
        version = next((p.name[len("mitogen-"):-len(".dist-info")] for p in target.glob("mitogen-*.dist-info")), "?")
        row = self.setup(f"re-run: mitogen {version} (mitogen_linear)", {
            "PYTHONPATH": str(target),
            "ANSIBLE_STRATEGY_PLUGINS": str(target / "ansible_mitogen" / "plugins" / "strategy"),
            "ANSIBLE_STRATEGY": "mitogen_linear"})
        if row["rc"] != 0:
            err = row.get("error", "")
            lines = [ln for ln in err.splitlines() if ln.strip()]
            row["error"] = " / ".join(lines[-3:])[-400:]
        return row

    # ------------------------------------------------------------------ launch
    def phases(self, run_dir: Path, t_start: float, t_end: float) -> dict:
        """Where one run's wall time went: the runner's own steps (timings.json of the run
        record) and, inside run.yml, each step (the play starts in the preflight step; a later step
        from the event that publishes its distrun_step to the last event before the next one),
        from ansible-runner's job events."""
        out: dict[str, float] = {}
        timings = run_dir / "timings.json"
        if not timings.exists():
            return out
        data = json.loads(timings.read_text())
        out["python start-up and exit"] = round((t_end - t_start) - data["total_s"], 2)
        for p in data["phases"]:
            out[p["name"]] = round(p["s"], 2)
        events: list[tuple[int, float, str | None]] = []  # (counter, time, step published here)
        for art in (run_dir / "ansible" / "artifacts").glob("*"):
            cmd = (art / "command").read_text() if (art / "command").exists() else ""
            if "playbooks/run.yml" not in cmd:
                continue
            for ev in (art / "job_events").glob("*.json"):
                try:
                    event = json.loads(ev.read_text())
                except (OSError, ValueError):
                    continue
                if not event.get("created"):
                    continue
                ts = (dt.datetime.fromisoformat(event["created"].replace("Z", "+00:00"))
                      .replace(tzinfo=dt.UTC).timestamp())
                facts = ((event.get("event_data") or {}).get("res") or {}).get("ansible_facts") or {}
                step = facts.get("distrun_step") if event.get("event") == "runner_on_ok" else None
                events.append((int(event.get("counter", 0)), ts, step))
        events.sort()
        spans: dict[str, list[float]] = {}
        step = "preflight"
        for _, ts, published in events:
            step = published or step
            spans.setdefault(step, []).append(ts)
        inside = 0.0
        for name, times in spans.items():
            inside += max(times) - min(times)
            out[f"  run.yml step: {name}"] = round(max(times) - min(times), 2)
        run_yml = out.get("run.yml (preflight, stage)")
        if run_yml is not None and spans:
            out["  run.yml outside its steps (ansible-runner, ansible-playbook start-up)"] = round(run_yml - inside, 2)
        return out

    def distrun_train(self, script: Path, extra_args: tuple[str, ...] = (), extra_env: dict | None = None) -> dict:
        t0 = time.time()
        proc, wall = run([DISTRUN, "train", "--inventory", str(self.hosts), "--script", str(script), *extra_args],
                         env=self.env(extra_env), timeout=600)
        t1 = time.time()
        m = RUN_ID.search(proc.stdout)
        row = {"wall_s": round(wall, 2), "rc": proc.returncode, "run_id": m[1] if m else None}
        if m:
            run_dir = Path(m[2])
            row["phases"] = self.phases(run_dir, t0, t1)
            plan = json.loads((run_dir / "plan.json").read_text())
            row["remote_run_dir"] = f"{plan['shared_dir'].rstrip('/')}/runs/{plan['run_id']}"
            row["cidr"] = plan.get("cidr")
        if proc.returncode != 0:
            row["error"] = (proc.stdout[-1500:] + proc.stderr[-800:]).strip()
        also = " ".join(f"{k}={v!r}" for k, v in (extra_env or {}).items())
        say(f"distrun train --script {script.name} {' '.join(extra_args):<17} {wall:6.2f} s rc={proc.returncode} {also}")
        return row

    def by_hand(self, cluster: podcluster.Cluster, remote_dir: str) -> dict:
        inner = (f"cd {shlex.quote(remote_dir)} && t0=$(date +%s.%N) && /usr/bin/mpirun -np 3 --hostfile "
                 f"{shlex.quote(remote_dir)}/hostfile /opt/distrun/venv/bin/python {shlex.quote(remote_dir)}/sleep10.py"
                 f" && t1=$(date +%s.%N) && echo MPIRUN_S $(echo \"$t1 - $t0\" | python3 -c 'print(round(eval(input()),2))')")
        cmd = f"su - distrun -c {shlex.quote(inner)}"
        t0 = time.monotonic()
        proc = cluster.ssh(1, cmd, check=False, timeout=300)
        wall = time.monotonic() - t0
        m = re.search(r"MPIRUN_S (\S+)", proc.stdout)
        row = {"wall_s": round(wall, 2), "rc": proc.returncode, "mpirun_s": float(m[1]) if m else None}
        if proc.returncode != 0:
            row["error"] = (proc.stdout[-800:] + proc.stderr[-800:]).strip()
        say(f"by hand: ssh + su + mpirun -np 3 sleep10.py   {wall:6.2f} s (mpirun alone {row['mpirun_s']} s) rc={proc.returncode}")
        return row

    def torch_by_hand(self, cluster: podcluster.Cluster, remote_dir: str, rep: int, cidr: str | None) -> dict:
        """torchrun started by hand on every node at once (one ssh each), c10d rendezvous on node1."""
        procs = []
        t0 = time.monotonic()
        # Gloo finds its interface by the hostname, which is on 127.0.1.1 here: name the one on the
        # cluster's network, as a user sets GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME on GPUs).
        iface = (f"export GLOO_SOCKET_IFNAME=$(ip -o -4 addr show to {shlex.quote(cidr)} | awk '{{print $2; exit}}') && "
                 if cidr else "")
        for k in range(1, 4):
            inner = (f"cd {shlex.quote(remote_dir)} && {iface}/opt/distrun/venv/bin/torchrun --nnodes=3 --nproc-per-node=1 "
                     f"--rdzv-backend=c10d --rdzv-endpoint={cluster.ip(1)}:{29520 + rep} --rdzv-id=hand{rep} "
                     # Nodes installed the Debian way (hostname on 127.0.1.1): torch can tell neither
                     # which agent hosts the store nor the address its peers reach an agent at, so
                     # the hand run says both, as distrun does.
                     f"--max-restarts=0 --rdzv-conf=is_host={1 if k == 1 else 0} --local-addr={cluster.ip(k)} "
                     f"{shlex.quote(remote_dir)}/sleep_torch.py")
            procs.append(subprocess.Popen(["ssh", *cluster.ssh_options(), f"root@{cluster.ip(k)}",
                                           f"su - distrun -c {shlex.quote(inner)}"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=300) for p in procs]
        wall = time.monotonic() - t0
        rc = max(p.returncode for p in procs)
        row = {"wall_s": round(wall, 2), "rc": rc}
        if rc != 0:
            row["error"] = " | ".join((o[0][-300:] + o[1][-400:]).strip() for o in outs)
        say(f"by hand: torchrun on 3 nodes (3 ssh)            {wall:6.2f} s rc={rc}")
        return row

    def torchrun_suite(self, cluster: podcluster.Cluster) -> dict:
        script = self.tmp / "sleep_torch.py"
        script.write_text(TORCH_PROGRAM)
        cold = self.distrun_train(script, ("--launcher", "torchrun"))
        if cold["rc"] != 0 or not cold.get("remote_run_dir"):
            return {"cold": cold}
        warm, hand = [], []
        for rep in range(2):
            hand.append(self.torch_by_hand(cluster, cold["remote_run_dir"], rep, cold.get("cidr")))
            warm.append(self.distrun_train(script, ("--launcher", "torchrun")))
        ok_w = [r["wall_s"] for r in warm if r["rc"] == 0]
        ok_h = [r["wall_s"] for r in hand if r["rc"] == 0]
        return {"cold": cold, "warm": warm, "hand": hand, "distrun_median_s": median(ok_w),
                "hand_median_s": median(ok_h), "gap_s": round(median(ok_w) - median(ok_h), 2) if ok_w and ok_h else None}

    def failure_suite(self, cluster: podcluster.Cluster) -> dict:
        t0 = time.monotonic()
        cluster.ssh(1, "true", check=False)
        ssh_s = time.monotonic() - t0
        load = os.getloadavg()[0]
        cluster.stop_node(2)
        try:
            proc, check_s = run([DISTRUN, "check", "--inventory", str(self.hosts), "--json"], env=self.env(), timeout=300)
        finally:
            cluster.start_node(2)
        try:
            named = json.loads(proc.stdout)["hosts"]["node2"]["state"]
        except (ValueError, KeyError):
            named = None
        say(f"check with node2 stopped: {check_s:6.2f} s, node2 {named} (ssh round trip {ssh_s:.2f} s, load {load:.2f})")
        script = self.tmp / "long.py"
        script.write_text(LONG_PROGRAM)
        env = self.env()
        t_start = time.monotonic()
        train = subprocess.Popen([DISTRUN, "train", "--inventory", str(self.hosts), "--script", str(script)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killed = None
        try:
            runs = Path(env["DISTRUN_HOME"]) / "runs"
            while time.monotonic() - t_start < 300 and killed is None:
                logs = sorted(runs.glob("*-train-*/launcher.log"), key=lambda f: f.stat().st_mtime)
                if logs and "LONG rank=2" in logs[-1].read_text(errors="replace") and train.poll() is None:
                    cluster.kill_node(3)
                    killed = time.monotonic()
                time.sleep(0.2)
            out, _ = train.communicate(timeout=300)
            end_s = time.monotonic() - killed if killed else None
        finally:
            if train.poll() is None:
                train.kill()
            cluster.start_node(3)
            # The run that lost node3 drained it: the next sections run on every node again.
            run([DISTRUN, "check", "--inventory", str(self.hosts), "--clear", "node3"], env=self.env(), timeout=120)
        say(f"train ended {end_s if end_s is None else round(end_s, 2)} s after node3 was killed, rc={train.returncode}")
        return {"ssh_true_s": round(ssh_s, 2), "load_1min": round(load, 2), "check_stopped_node_s": round(check_s, 2),
                "check_node2_state": named, "check_rc": proc.returncode,
                "killed_node_end_s": None if end_s is None else round(end_s, 2), "train_rc": train.returncode,
                "train_tail": None if train.returncode not in (0, None) and killed else out[-800:]}

    def long_runs_suite(self) -> dict:
        """A detached run of LONG_PROGRAM: how long detaching, reading it from the nodes and refusing
        a second run on its hosts take; then it is stopped."""
        script = self.tmp / "long_detached.py"
        script.write_text(LONG_PROGRAM)
        load = os.getloadavg()[0]
        base = [DISTRUN, "train", "--inventory", str(self.hosts), "--script", str(script)]
        detach, detach_s = run([*base, "--detach"], env=self.env(), timeout=600)
        run_id = detach.stdout.strip().splitlines()[-1] if detach.returncode == 0 and detach.stdout.strip() else None
        out: dict = {"load_1min": round(load, 2), "detach_s": round(detach_s, 2), "detach_rc": detach.returncode}
        if run_id is None:
            return {**out, "error": (detach.stdout[-800:] + detach.stderr[-800:]).strip()}
        try:
            status, status_s = run([DISTRUN, "status", run_id, "--json"], env=self.env(), timeout=300)
            listed, runs_s = run([DISTRUN, "runs"], env=self.env(), timeout=300)
            refused, refused_s = run(base, env=self.env(), timeout=300)
            try:
                state = json.loads(status.stdout).get("state")
            except ValueError:
                state = None
            out.update({"status_s": round(status_s, 2), "status_state": state, "runs_s": round(runs_s, 2),
                        "runs_rc": listed.returncode, "busy_refused_s": round(refused_s, 2), "busy_rc": refused.returncode,
                        "busy_named_run": run_id in refused.stderr})
        finally:
            stop, stop_s = run([DISTRUN, "stop", run_id], env=self.env(), timeout=300)
            out.update({"stop_s": round(stop_s, 2), "stop_rc": stop.returncode})
        say(f"long runs: detach {out['detach_s']} s, status {out.get('status_s')} s ({out.get('status_state')}), "
            f"runs {out.get('runs_s')} s, busy refusal {out.get('busy_refused_s')} s rc={out.get('busy_rc')}")
        return out

    def ansible_floor(self, reps: int = 3) -> dict:
        """What every ansible-playbook run costs before its first task, here: the interpreter and
        Ansible's imports (`ansible-playbook --version`), and an empty play (one no-op task on this
        machine) through ansible-runner, to its first event and to its end: started as
        ansible-playbook, and as distrun starts it (distrun-ansible-playbook: the same program,
        nothing of Ansible changed), interleaved. run.yml pays these
        on every `distrun train`; they bound how small the launch gap can get."""
        bin_dir = Path(sys.executable).parent
        env = {**self.env(), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
               "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        version = [run([str(bin_dir / "ansible-playbook"), "--version"], env=env, timeout=120)[1] for _ in range(reps)]
        play = self.tmp / "noop.yml"
        play.write_text("- name: Nothing\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - name: No-op\n      ansible.builtin.meta: noop\n")
        private = self.tmp / "floor"
        private.mkdir(exist_ok=True)
        probe = ("import sys, time, ansible_runner\n"
                 "first = []\n"
                 "program = sys.argv[3] if len(sys.argv) > 3 else None\n"
                 "t0 = time.monotonic()\n"
                 "ansible_runner.run(private_data_dir=sys.argv[1], playbook=sys.argv[2], inventory='localhost,',"
                 " cmdline='-c local' + (' ' + sys.argv[2] if program else ''), binary=program, quiet=True,"
                 " suppress_env_files=True, event_handler=lambda e: first.append(time.monotonic()) or True)\n"
                 "print(round(first[0] - t0, 3), round(time.monotonic() - t0, 3))\n")
        program = str(bin_dir / "distrun-ansible-playbook")
        out: dict = {"version_s": [round(x, 2) for x in version]}
        for _ in range(reps):
            for key, argv, where in (("empty", [], env), ("distrun", [program], env)):
                proc, _wall = run([sys.executable, "-c", probe, str(private), str(play), *argv], env=where, timeout=120)
                try:
                    a, b = (float(x) for x in proc.stdout.split()[-2:])
                except ValueError:
                    say(f"ansible floor: the empty play did not run ({key}): {(proc.stdout + proc.stderr)[-300:]}")
                    continue
                out.setdefault(f"{key}_first_event_s", []).append(a)
                out.setdefault(f"{key}_total_s", []).append(b)
        say(f"ansible floor: ansible-playbook --version {median(version):.2f} s, empty play through ansible-runner: "
            f"first event {median(out.get('empty_first_event_s') or [0]):.2f} s "
            f"(distrun-ansible-playbook {median(out.get('distrun_first_event_s') or [0]):.2f} s), "
            f"end {median(out.get('empty_total_s') or [0]):.2f} s")
        return out

    def launch_suite(self, cluster: podcluster.Cluster) -> dict:
        script = self.tmp / "sleep10.py"
        script.write_text(SLEEP_PROGRAM)
        t0 = time.monotonic()
        ssh_probe = cluster.ssh(1, "true", check=False)
        ssh_s = time.monotonic() - t0
        cold = self.distrun_train(script)
        if cold["rc"] != 0 or not cold.get("remote_run_dir"):
            say(cold.get("error", ""))
            return {"cold": cold}
        # Five of each, interleaved: one run on this machine varies by a few tenths of a second.
        reps = 1 if self.quick else 5
        warm, hand = [], []
        for _ in range(reps):
            hand.append(self.by_hand(cluster, cold["remote_run_dir"]))
            warm.append(self.distrun_train(script))
        skip = None if self.quick else self.distrun_train(script, ("--skip-preflight",))
        ok_w = [r["wall_s"] for r in warm if r["rc"] == 0]
        ok_h = [r["wall_s"] for r in hand if r["rc"] == 0]
        return {"ssh_true_s": round(ssh_s, 2), "ssh_rc": ssh_probe.returncode, "cold": cold, "warm": warm,
                "ansible_floor": self.ansible_floor(1 if self.quick else 3),
                "hand": hand, "skip_preflight": skip, "distrun_median_s": median(ok_w),
                "hand_median_s": median(ok_h), "gap_s": round(median(ok_w) - median(ok_h), 2) if ok_w and ok_h else None}


def plot(c: dict, path: Path) -> bool:
    """Launch overhead per phase: for mpirun and torchrun, the hand-started run's median wall time
    beside the last warm distrun run split into its phases (the run.yml steps inside run.yml)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    suites = [(name, c.get(key)) for name, key in (("mpirun", "launch"), ("torchrun", "torchrun"))]
    suites = [(n, s) for n, s in suites if s and s.get("hand_median_s") and any(r.get("phases") for r in s.get("warm", []))]
    if not suites:
        return False
    fig, axes = plt.subplots(1, len(suites), figsize=(6 * len(suites), 3.2), squeeze=False)
    for ax, (name, s) in zip(axes[0], suites, strict=True):
        last = next(r for r in reversed(s["warm"]) if r.get("phases"))
        phases = {k: v for k, v in last["phases"].items() if not k.startswith("  ") and v > 0.005}
        left = 0.0
        for i, (label, secs) in enumerate(phases.items()):
            ax.barh(["distrun"], [secs], left=left, color=plt.cm.tab20(i % 20), label=f"{label} {secs:.2f} s")
            left += secs
        ax.barh(["by hand"], [s["hand_median_s"]], color="0.6", label=f"by hand (median) {s['hand_median_s']:.2f} s")
        ax.axvline(s["hand_median_s"] * 1.10, color="k", linestyle="--", linewidth=1, label="target: by hand x 1.10")
        ax.set_title(f"{name}: ratio {s['distrun_median_s'] / s['hand_median_s']:.2f} (medians)")
        ax.set_xlabel("seconds (10 s job, 3 nodes)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    # SIGTERM, and Ctrl-C even when started in the background, end through the finally below.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-bench-"))
    tmp.chmod(0o700)
    result: dict = {"quick": args.quick}
    bench = Bench(tmp, args.quick)
    shutil.copytree(REPO / "inventory" / "test" / "group_vars", bench.inv_dir / "group_vars")
    t0 = time.monotonic()
    cluster = None
    try:
        cluster = podcluster.up(3, name=NAME, wheelhouse=Path("/opt/wheels"), inventory=bench.hosts)
        result["cluster_up_s"] = round(time.monotonic() - t0, 1)
        say(f"cluster {NAME}: 3 nodes up in {result['cluster_up_s']} s")
        result["setup"] = bench.setup_suite()
        if result["setup"]["rows"][0]["rc"] == 0:
            # Launch first: it needs only a converged cluster, and its result comes early.
            result["launch"] = bench.launch_suite(cluster)
            try:
                result["long_runs"] = bench.long_runs_suite()
            except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
                result["long_runs"] = {"error": f"{type(exc).__name__}: {exc}"}
            if not args.quick:
                try:
                    result["torchrun"] = bench.torchrun_suite(cluster)
                except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
                    result["torchrun"] = {"error": f"{type(exc).__name__}: {exc}"}
                result["setup"] = bench.setup_variants(result["setup"])
            # Last: a restarted node may come back with another address until the next setup.
            try:
                result["failures"] = bench.failure_suite(cluster)
            except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
                result["failures"] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        if cluster is not None:
            cluster.down()
        else:
            podcluster.down(NAME)
        say(f"cluster {NAME} removed")
        if args.json:
            write_json(args.json, result)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
