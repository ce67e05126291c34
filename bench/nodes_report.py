"""The nodes benchmark's figures (bench/nodes.py's JSON) side by side: ratios against the smallest
size, the per-node slope, the linear model to larger clusters, and its Markdown section.

Pure functions of the JSON; bench/run_all.py renders the section with them.
"""

from __future__ import annotations

import statistics

TARGET_RATIO = 1.5  # check and the launch overhead at the largest size, against the smallest
# check twice in a row: the first logs in from every node to every other, the second, with nothing
# changed on any node, checks the sshd banners instead (distrun.preflight.sshmesh)
CHECK_FIRST = "`check`, first run: every node logs in to every other"
CHECK_AGAIN = "`check` again, nothing changed: sshd banners"
PROJECT_TO = (256, 1024)


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares seconds per node through (nodes, seconds); None with fewer than 2 sizes."""
    if len({n for n, _ in points}) < 2:
        return None
    mx = statistics.fmean(n for n, _ in points)
    my = statistics.fmean(v for _, v in points)
    return sum((n - mx) * (v - my) for n, v in points) / sum((n - mx) ** 2 for n, _ in points)


def figure_row(name: str, points: list[tuple[int, float]]) -> dict:
    """One figure across sizes: its values, each against the smallest size, the slope and the
    linear model at PROJECT_TO (intercept through the smallest size's value)."""
    points = sorted(points)
    if not points:
        return {"figure": name, "values": {}, "ratio": {}, "slope": None, "model": {}}
    n0, v0 = points[0]
    k = slope(points)
    return {"figure": name, "values": dict(points),
            "ratio": {n: (v / v0 if v0 else None) for n, v in points},
            "slope": k, "model": {m: v0 + k * (m - n0) for m in PROJECT_TO} if k is not None else {}}


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "error" not in r]


def figures(data: dict) -> list[dict]:
    """The table's rows from the benchmark's JSON."""
    rows = _ok(data.get("rows") or [])
    job = data.get("job_s", 1.0)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    series: dict[str, list[tuple[int, float]]] = {}

    def add(name: str, n: int, v: float | None) -> None:
        if v is not None:
            series.setdefault(name, []).append((n, v))

    for r in rows:
        n = r["nodes"]
        checks = [c for c in r["check"] if c.get("ok") is not None]
        add(CHECK_FIRST, n, checks[0]["wall_s"] if checks[:1] else None)
        add(CHECK_AGAIN, n, checks[1]["wall_s"] if checks[1:2] else None)
        add("`train --script`, 1 s job (median of 3)", n, r.get("train_median_s"))
        add(f"launch overhead (train − {job:g} s)", n, None if r.get("train_median_s") is None else r["train_median_s"] - job)
        add("collect phase of those runs", n, r.get("collect_median_s"))
        add("`train --detach` of a long job", n, (r.get("detach") or {}).get("wall_s") if (r.get("detach") or {}).get("rc") == 0 else None)
        add("`stop` of it", n, (r.get("stop") or {}).get("wall_s") if (r.get("stop") or {}).get("rc") == 0 else None)
        add("`check --json` output, KiB", n, med([c["json_bytes"] / 1024 for c in r["check"] if c.get("json_bytes")]))
        add("one train run's record, KiB", n, med([t["record_bytes"] / 1024 for t in r["train"] if t.get("record_bytes")]))
    setup = [s for s in data.get("setup") or [] if s.get("rc") == 0]
    for s in setup:
        add("`setup` first converge" if s["label"].startswith("first") else "`setup` re-run", s["nodes"], s["wall_s"])
    order = ["`setup` first converge", "`setup` re-run"]
    return [figure_row(k, v) for k, v in sorted(series.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else -1)]


def false_failures(data: dict) -> list[str]:
    """Every failure a check reported while every node was up (none is expected)."""
    return [f"{r['nodes']} nodes, run {i + 1}: {f}" for r in _ok(data.get("rows") or [])
            for i, c in enumerate(r["check"]) for f in (c.get("failures") or [])]


def verdicts(table: list[dict]) -> list[tuple[str, float, bool]]:
    """(figure, ratio at the largest size, met) for the two figures with a target."""
    out = []
    for row in table:
        if row["figure"].startswith(("`check`", "launch overhead")) and row["ratio"]:
            r = row["ratio"][max(row["ratio"])]
            if r is not None:
                out.append((row["figure"], r, r <= TARGET_RATIO))
    return out


def _f(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def table_lines(table: list[dict], sizes: list[int]) -> list[str]:
    head = ["figure (s unless named)", *[f"{n} nodes" for n in sizes], f"{sizes[-1]} vs {sizes[0]}", "per node",
            *[f"model {m:,}" for m in PROJECT_TO]]
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for row in table:
        big = max(row["ratio"]) if row["ratio"] else None
        cells = [row["figure"], *[_f(row["values"].get(n)) for n in sizes],
                 f"{_f(row['ratio'].get(big))}x" if big and big != min(row["ratio"]) else "—",
                 _f(row["slope"], 3), *[_f(row["model"].get(m), 0) for m in PROJECT_TO]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def console(data: dict) -> list[str]:
    sizes = data.get("sizes") or []
    if not sizes or not data.get("rows"):
        return ["nodes: nothing measured"] + [s.get("error", "")[-600:] for s in data.get("setup") or [] if s.get("error")]
    table = figures(data)
    out = table_lines(table, sizes)
    for fig, r, met in verdicts(table):
        out.append(f"target {fig}: {r:.2f}x of {sizes[0]} nodes (<= {TARGET_RATIO}) {'met' if met else 'NOT met'}")
    ff = false_failures(data)
    out.append(f"check failures with every node up: {len(ff)}" + "".join(f"\n  {x}" for x in ff))
    out += _forks_lines(data)
    lost = data.get("lost")
    if lost:
        c, t = lost["check"], lost["train"]
        out.append(f"{lost['stopped']} stopped: check {c['wall_s']} s rc={c['rc']} names it={c.get('names_it')}; "
                   f"train {t['wall_s']} s rc={t['rc']} refused={t.get('refused')} names it={t.get('names_it')}")
    return out


def summary_rows(data: dict | None) -> list[str]:
    if not data or not data.get("rows"):
        return []
    sizes = data["sizes"]
    out = []
    for row in figures(data):
        if row["figure"].startswith(("`check`", "launch overhead")) and len(row["values"]) > 1:
            big = max(row["values"])
            r = row["ratio"][big]
            out.append(f"| {row['figure'].replace('`', '')} at {big} nodes | {_f(row['values'][big])} s | "
                       f"{sizes[0]} nodes {_f(row['values'].get(sizes[0]))} s: ratio {_f(r)} | ≤ {TARGET_RATIO} | "
                       f"{'met' if r is not None and r <= TARGET_RATIO else 'not met'} |")
    return out


def _setup_lines(data: dict) -> list[str]:
    out = ["| `distrun setup` run | nodes | wall s | changed | rc |", "|---|---:|---:|---:|---:|"]
    for s in data.get("setup") or []:
        out.append(f"| {s['label']} | {s['nodes']} | {_f(s['wall_s'], 1)} | {s.get('changed')} | {s['rc']} |")
    return out


def _lost_lines(data: dict) -> list[str]:
    lost = data.get("lost")
    if not lost:
        return ["One unreachable node: not measured in this run."]
    c, t = lost["check"], lost["train"]
    yes = lambda b: "yes" if b else "**no**"  # noqa: E731
    return [f"One unreachable node among {lost['nodes']} ({lost['stopped']}'s container stopped): `distrun check` "
            f"took {_f(c['wall_s'])} s (rc {c['rc']}; names it: {yes(c.get('names_it'))}), `distrun train` "
            f"{_f(t['wall_s'])} s (rc {t['rc']}; refused before launching: {yes(t.get('refused'))}; names it: "
            f"{yes(t.get('names_it'))}). Against the same `check` with every node up, and the 1.5x bound of its "
            f"{min(data['sizes'])}-node figure: see the table. `train`'s refusal pays ssh's connect timeout to the "
            "stopped node twice in a row, by the code's order: the claim on the run's hosts (ssh, `ConnectTimeout=10`, "
            "after 3 s for the masters) answers before run.yml's probe task may start, and Ansible's own connection "
            "then waits out `ANSIBLE_TIMEOUT` (10 s) again; `check` pays it once."]


def _forks_lines(data: dict) -> list[str]:
    ff = data.get("fewer_forks")
    if not ff or "error" in ff:
        return [f"Fewer forks than nodes: not measured{': ' + ff['error'] if ff else ''}."]
    c, t = ff["check"], ff["train"]
    fails = c.get("failures") or []
    out = [f"Fewer Ansible forks than nodes (`ANSIBLE_FORKS={ff['forks']}` on {ff['nodes']} nodes, as ansible.cfg's "
           f"`forks = 20` on any cluster past 20 nodes): `check` {_f(c['wall_s'])} s, rc {c['rc']}, "
           f"{len(fails)} failure(s) reported; `train` {_f(t['wall_s'])} s, rc {t['rc']}."]
    out += [f"- `{x.replace('|', '/')}`" for x in fails[:3]] + ([f"- ... and {len(fails) - 3} more"] if len(fails) > 3 else [])
    if t.get("error"):
        out.append(f"- train: `{t['error'].strip().splitlines()[-1][:400]}`")
    return out


def render(data: dict | None) -> list[str]:
    out = ["## Scale on real nodes: the CLI's verbs on up to 16 light podman nodes", ""]
    if not data or not data.get("rows"):
        errs = [s.get("error", "") for s in (data or {}).get("setup") or [] if s.get("error")]
        return out + ["Not measured in this run" + (f": `{errs[0][-400:]}`" if errs else "."), ""]
    sizes = data["sizes"]
    table = figures(data)
    m = data.get("machine") or {}
    out += [f"`bench/nodes.py` on {m.get('date_utc', '?')} (load {m.get('load_1min_at_start', '?')} at start): "
            f"{sizes[-1]} light nodes (Debian 12 containers with systemd and sshd, brought up once in "
            f"{_f(data.get('up_s'), 1)} s) on this 2-core, 24 GiB machine, which held all {sizes[-1]} at once (the "
            "issue's largest size; more were not tried). An INI inventory with aliases (`alpha`, `w2` ..) per size lists the first N of "
            "them; shared folder sshfs; Open MPI and a venv with mpi4py, nothing else (no torch, Jittor, Slurm). "
            f"One run: `setup` first at {sizes[0]}, then at {sizes[-1]} (its first {sizes[0]} already converged, "
            f"the other {sizes[-1] - sizes[0]} fresh); then per size `check` twice in a row (the first logs in from every node to every other, "
            "the second, with nothing changed on any node, checks the sshd banners), `train --script` of "
            "a 1-second mpi4py job three times, `train --detach` of a long job and `stop` of it. \"per node\" is "
            "the least-squares slope through the sizes; the model columns extend it linearly (modelled, not "
            "measured: see below). Each figure is one run on a loaded 2-core machine: ±10% is noise. Every node "
            "and the controller share these 2 cores, so a figure here grows with the work of the whole cluster "
            "(16 nodes' probes, ssh logins and ranks run on 2 cores), where on real nodes each node's share runs "
            "on its own CPU: the ratios are an upper bound of what the same code costs on 16 machines.", ""]
    out += _setup_lines(data) + [""] + table_lines(table, sizes) + [""]
    for fig, r, met in verdicts(table):
        out.append(f"**Target** ({fig.replace('`', '')} at {sizes[-1]} nodes ≤ {TARGET_RATIO}x its {sizes[0]}-node "
                   f"figure): {r:.2f}x — **{'met' if met else 'not met'}**.")
    ff = false_failures(data)
    out += ["", "`check` twice in a row at each size with every node up: "
            + ("no failure reported in any run." if not ff else f"**{len(ff)} failure(s) reported**:")]
    out += [f"- `{x.replace('|', '/')}`" for x in ff[:6]] + ([f"- ... and {len(ff) - 6} more"] if len(ff) > 6 else [])
    out += _failure_reading(ff + ((data.get("fewer_forks") or {}).get("check") or {}).get("failures", []))
    out += [""] + _where_lines(data) + [""] + _lost_lines(data) + [""] + _forks_lines(data) + ["", *projection(table, sizes), ""]
    return out


def _failure_reading(failures: list[str]) -> list[str]:
    """What the probe's words mean in these runs, where nothing was wrong with the network."""
    out = ["", "Reading of these failures (nothing was wrong with the nodes' network; the second `check` right "
           "after passed):"]
    if any("another program answers" in f for f in failures):
        out.append("- \"another program answers\" on the head's rendezvous port, where only the probe listens: the "
                   "probe's listener greeted its callers one after another, and on loaded nodes the last of 15 "
                   "waited longer for its greeting than it waits (1 s), which the caller took for another program. "
                   "Changed since: each caller is greeted in its own thread, and a connection accepted without a "
                   "greeting yet is called again until the deadline (`silent` if it never comes).")
    if any("refused" in f for f in failures):
        out.append("- \"refused\" between healthy nodes: a node's listener stops when every other node called or "
                   "at twice `preflight_net_timeout` after its own probe started, and its calls retry a refusal as "
                   "long; nodes whose probes start further apart than that miss each other. On these 16 loaded "
                   "nodes the probes started over more than 16 s; with fewer Ansible forks than nodes the nodes "
                   "past the first forks start only when the first ones have given up (the row below). Changed "
                   "since: `distrun check` runs its play with one fork per node, and while a node's probe is still "
                   "at its other checks (the ssh mesh: most of the probe's time at 16 nodes) its listener stays "
                   "open and its calls retry a refusal. Not measured again on 16 nodes; a spread longer than "
                   "the probe itself still misses (raise `preflight_net_timeout`).")
    return out if len(out) > 2 else []


def _where_lines(data: dict) -> list[str]:
    """Where the time of check and train goes at each size (task spans and the run's phases)."""
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    probe = "Probe env, versions, shared folder, ssh, names and ports as distrun"
    out = ["Where the time goes (medians; the probe is one raw command per node: in `check` the full set, "
           "with the ssh logins (first run) or sshd banners (again) and TCP connections between every pair of "
           "nodes):", "",
           "| nodes | `check`: probe s, first / again | `check`: gathering facts s | `train`: run.yml s | of which the probe s "
           "| `train`: follow s |", "|---:|---:|---:|---:|---:|---:|"]
    for r in _ok(data.get("rows") or []):
        c, t = r["check"], r["train"]
        spans = " / ".join(_f((x.get("tasks") or {}).get(probe)) for x in c)
        out.append(f"| {r['nodes']} | {spans} | "
                   f"{_f(med([x['tasks'].get('Gathering Facts') for x in c if (x.get('tasks') or {}).get('Gathering Facts')]))} | "
                   f"{_f(med([x['phases'].get('run.yml (preflight, stage)') for x in t if x.get('phases')]))} | "
                   f"{_f(med([x['tasks'].get(probe) for x in t if (x.get('tasks') or {}).get(probe)]))} | "
                   f"{_f(med([x['phases'].get('follow (ranks run)') for x in t if (x.get('phases') or {}).get('follow (ranks run)')]))} |")
    return out + _check_reading(_ok(data.get("rows") or []), probe) + _cpu_lines(data)


def _cpu(runs: list[dict]) -> dict | None:
    """The medians of the runs' CPU figures (None when no run measured them)."""
    cpus = [r["cpu"] for r in runs if r.get("cpu") and r.get("wall_s")]
    if not cpus:
        return None
    med = statistics.median
    return {"wall_s": med([r["wall_s"] for r in runs if r.get("cpu") and r.get("wall_s")]),
            "machine_s": med([c["machine_s"] for c in cpus]), "command_s": med([c["command_s"] for c in cpus]),
            "cores": cpus[0]["cores"]}


def _cpu_lines(data: dict) -> list[str]:
    """How busy the machine's cores were while each verb ran, and whose work it was."""
    rows, seen = [], {}
    for r in _ok(data.get("rows") or []):
        checks = [c for c in r.get("check") or [] if c.get("ok") is not None]
        for label, runs in (("`check`, first run", checks[:1]), ("`check` again", checks[1:2]),
                            ("`train --script`, 1 s job", r.get("train") or [])):
            c = _cpu(runs)
            if c:
                seen.setdefault(label, {})[r["nodes"]] = c
                nodes_s = max(c["machine_s"] - c["command_s"], 0.0)
                rows.append(f"| {r['nodes']} | {label} | {_f(c['wall_s'])} | {_f(c['machine_s'])} | "
                            f"{100 * c['machine_s'] / (c['wall_s'] * c['cores']):.0f}% | {_f(c['command_s'])} | "
                            f"{_f(nodes_s)} | {_f(nodes_s / r['nodes'], 3)} |")
    if not rows:
        return []
    return ["", "CPU while each verb ran (medians): every core's busy time on this machine (the nodes are "
            "containers on it), the share of the verb's own processes on the controller (distrun, "
            "ansible-playbook and its forks, their ssh clients), and the rest, which is the nodes' work (with "
            "whatever else ran: a few percent when idle):", "",
            "| nodes | verb | wall s | CPU s, all cores | cores busy | controller's CPU s | the nodes' CPU s | per node |",
            "|---:|---|---:|---:|---:|---:|---:|---:|", *rows, *_cpu_reading(seen)]


def _cpu_reading(seen: dict[str, dict[int, dict]]) -> list[str]:
    """The controller's CPU from the smallest to the largest size, per verb."""
    parts, busy = [], []
    for label, by_size in seen.items():
        if len(by_size) < 2:
            continue
        a, b = min(by_size), max(by_size)
        ca, cb = by_size[a], by_size[b]
        busy.append(f"{100 * cb['machine_s'] / (cb['wall_s'] * cb['cores']):.0f}% ({label})")
        parts.append(f"{label} {_f(ca['command_s'])} s at {a} nodes and {_f(cb['command_s'])} s at {b} "
                     f"({_f((cb['command_s'] - ca['command_s']) / (b - a), 2)} s per node added)")
    if not parts:
        return []
    return ["", f"Reading: at the largest size the cores were busy {', '.join(busy)} of the wall time: here the wall "
                "time is this machine's CPU, shared by the controller and every node. The controller's own CPU "
                f"grows with the nodes: {'; '.join(parts)}. That part is the work per host of ansible-playbook's "
                "forks and their ssh clients, and stays on the controller on real machines; the nodes' part runs on "
                "each node's own CPU there."]


def _check_reading(rows: list[dict], probe: str) -> list[str]:
    """What the second check saved at the largest size, and what the rest of its time is."""
    big = max(rows, key=lambda r: r["nodes"], default=None)
    checks = [c for c in (big or {}).get("check") or [] if (c.get("tasks") or {}).get(probe)]
    if len(checks) < 2:
        return []
    first, again = checks[0], checks[1]
    facts = (again.get("tasks") or {}).get("Gathering Facts") or 0.0
    rest = again["wall_s"] - again["tasks"][probe] - facts
    return ["", f"Reading: at {big['nodes']} nodes the second `check`'s probe took {_f(again['tasks'][probe])} s against "
                f"{_f(first['tasks'][probe])} s with logins ({_f(first['tasks'][probe] / again['tasks'][probe], 1)}x less); "
                f"the rest of its {_f(again['wall_s'])} s is Ansible's fact gathering ({_f(facts)} s, which `check` "
                f"always renews) and its other steps ({_f(rest)} s: ansible-playbook's start, the head's probe file "
                "seen on every node, the judge), all of which grow with the work of every node on these 2 cores."]


def _model(table: list[dict], prefix: str) -> dict:
    return next((r for r in table if r["figure"].startswith(prefix)), {"values": {}, "slope": None, "model": {}})


def projection(table: list[dict], sizes: list[int]) -> list[str]:
    chk, again, ovh = _model(table, CHECK_FIRST), _model(table, CHECK_AGAIN), _model(table, "launch overhead")
    st1, st2 = _model(table, "`setup` first"), _model(table, "`setup` re-run")
    rec, out = _model(table, "one train run's record"), _model(table, "`check --json`")
    g = lambda row, m: _f(row["model"].get(m), 0)  # noqa: E731
    return [
        "### Projection to 256 and 1,024 nodes", "",
        f"Measured: the tables above, {sizes[0]} to {sizes[-1]} nodes on one 2-core machine. Modelled: the model "
        "columns (the measured line extended; an upper bound, since here every node's work shares the "
        "controller's 2 cores) and everything below, which follows from the code's settings and the tools' "
        "documented behaviour, not from a run. In the order they break:", "",
        "1. **`check`'s network probe, at more nodes than Ansible forks (21 with ansible.cfg's `forks = 20`).** "
        "The full probe needs every node's probe running at once: each node listens for every other and calls "
        "every other, within one deadline. With fewer forks than nodes, the nodes past the first forks start "
        "only when the first ones finish, after they stopped listening: every pair across the two groups is "
        "reported refused (measured above with 8 forks on 16 nodes). `distrun check` now asks for one fork per "
        "node; at 256 and 1,024 nodes that is 256 and 1,024 worker processes on the controller for one raw "
        "task, which a large controller carries and a laptop does not. The probe also keeps listening and "
        "calling now while its other checks run, which covers a spread as long as the probe. What would "
        "remove the limit: a deadline shared by every node (from the play's start), or a sampled pattern of "
        "pairs.",
        "2. **`train`'s preflight at a few hundred nodes.** Every node calls the head's rendezvous port once "
        "(N−1 connections, linear); the head's listener accepts with a backlog of 64 and now greets each "
        "caller in a thread. With `forks = 20`, run.yml reaches the nodes in ceil(N/20) rounds (13 at 256, 52 "
        "at 1,024) while the head's listener waits at most twice `preflight_net_timeout` (16 s) for callers: "
        "with a round of about 0.5–1 s (a short probe), 13 rounds fit and 52 do not. Settings: `forks` at least the node count for run.yml "
        "(ANSIBLE_FORKS), `preflight_net_timeout`.",
        f"3. **`check`'s ssh mesh.** A first `check` (and one after a node changed what a login depends on) "
        "logs in from every node to every other: N(N−1) logins (65,280 at 256 nodes, 1,047,552 at 1,024), 4 at "
        "a time per node in ring order (`SSH_FAN_OUT`), so each sshd sees about 4 unauthenticated connections "
        "at once, under `MaxStartups` 10 at any size. Per node that is (N−1)/4 waves of one login each (0.1–0.3 s "
        "on idle nodes): about 13 s at 256 nodes and 50 s at 1,024, linear and on every node at once; here, with "
        "all nodes on 2 cores, the whole mesh's CPU is serial, which accounts for most of the first run's growth "
        f"in the table above and of its modelled {g(chk, 256)} s and {g(chk, 1024)} s. A `check` with nothing "
        "changed since those logins checks sshd's banner instead (`ssh -G` and one TCP connection per pair, the "
        f"same N(N−1) pairs at a fraction of a login's CPU): modelled {g(again, 256)} s and {g(again, 1024)} s "
        "from the second row. Setting: `SSH_FAN_OUT` (with `MaxStartups` on the nodes).",
        f"4. **`setup`: Ansible forks.** Below 20 nodes every host is in one round of forks; past it every task "
        "runs in ceil(N/20) rounds. The measured slope (the controller's CPU per host and task, and here the "
        f"nodes' too) gives a first converge of {g(st1, 256)} s and {g(st1, 1024)} s and a re-run of "
        f"{g(st2, 256)} s and {g(st2, 1024)} s: hours at 1,024 nodes. Settings: `forks` and the controller's "
        "cores (each fork a worker process); pipelining and ControlPersist are already on.",
        f"5. **The launch.** The launch overhead grows {_f(ovh['slope'], 3)} s per node here "
        f"({g(ovh, 256)} s and {g(ovh, 1024)} s modelled), mostly run.yml's probe and "
        "following 16 ranks on 2 cores. mpirun starts its daemons by tree spawn, at most "
        "`plm_rsh_num_concurrent` (128) ssh sessions at a time per launching daemon: its own start grows with "
        "log N and needs ssh from node to node (the mesh `setup` installs). torchrun's agents are started per "
        "node over the ssh master distrun holds per node: N masters on the controller (a process and file "
        "descriptors each, under `ulimit -n` at 1,024).",
        f"6. **Records.** A train run's record grows by {_f(rec['slope'], 1)} KiB per node (ansible-runner's "
        f"events: one per host and task), modelled at {g(rec, 256)} KiB and {g(rec, 1024)} KiB; `check --json` "
        f"at {g(out, 256)} KiB and {g(out, 1024)} KiB. Not a limit.",
    ]
