"""The nodes benchmark's figures (bench/nodes.py's JSON) side by side: ratios against the smallest
size, the per-node slope, the linear model to larger clusters, and its Markdown section.

Pure functions of the JSON; bench/run_all.py renders the section with them.
"""

from __future__ import annotations

import statistics

TARGET_RATIO = 1.5  # check and the launch overhead at the largest size, against the smallest
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
        add("`check` (median of 2 runs)", n, med([c["wall_s"] for c in r["check"] if c.get("ok") is not None]))
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
            f"{yes(t.get('names_it'))})."]


def _forks_lines(data: dict) -> list[str]:
    ff = data.get("fewer_forks")
    if not ff or "error" in ff:
        return [f"Fewer forks than nodes: not measured{': ' + ff['error'] if ff else ''}."]
    c, t = ff["check"], ff["train"]
    fails = c.get("failures") or []
    out = [f"Fewer Ansible forks than nodes (`ANSIBLE_FORKS={ff['forks']}` on {ff['nodes']} nodes, as ansible.cfg's "
           f"`forks = 20` on any cluster past 20 nodes): `check` {_f(c['wall_s'])} s, rc {c['rc']}, "
           f"{len(fails)} failure(s) reported; `train` {_f(t['wall_s'])} s, rc {t['rc']}."]
    out += [f"- `{x.replace('|', '/')}`" for x in fails[:6]] + ([f"- ... and {len(fails) - 6} more"] if len(fails) > 6 else [])
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
            f"{_f(data.get('up_s'), 1)} s) on this 2-core machine; no more were tried (15 were up together before, "
            "the issue's bound). An INI inventory with aliases (`alpha`, `w2` ..) per size lists the first N of "
            "them; shared folder sshfs; Open MPI and a venv with mpi4py, nothing else (no torch, Jittor, Slurm). "
            f"One run: `setup` first at {sizes[0]}, then at {sizes[-1]} (its first {sizes[0]} already converged, "
            f"the other {sizes[-1] - sizes[0]} fresh); then per size `check` twice in a row, `train --script` of "
            "a 1-second mpi4py job three times, `train --detach` of a long job and `stop` of it. \"per node\" is "
            "the least-squares slope through the sizes; the model columns extend it linearly (modelled, not "
            "measured: see below). Each figure is one run on a loaded 2-core machine: ±10% is noise.", ""]
    out += _setup_lines(data) + [""] + table_lines(table, sizes) + [""]
    for fig, r, met in verdicts(table):
        out.append(f"**Target** ({fig.replace('`', '')} at {sizes[-1]} nodes ≤ {TARGET_RATIO}x its {sizes[0]}-node "
                   f"figure): {r:.2f}x — **{'met' if met else 'not met'}**.")
    ff = false_failures(data)
    out += ["", "`check` twice in a row at each size with every node up: "
            + ("no failure reported in any run." if not ff else f"**{len(ff)} failure(s) reported**:")]
    out += [f"- `{x.replace('|', '/')}`" for x in ff]
    out += [""] + _lost_lines(data) + [""] + _forks_lines(data) + ["", *projection(table, sizes), ""]
    return out


def _model(table: list[dict], prefix: str) -> dict:
    return next((r for r in table if r["figure"].startswith(prefix)), {"values": {}, "slope": None, "model": {}})


def projection(table: list[dict], sizes: list[int]) -> list[str]:
    chk, ovh = _model(table, "`check`"), _model(table, "launch overhead")
    st1, st2 = _model(table, "`setup` first"), _model(table, "`setup` re-run")
    rec = _model(table, "one train run's record")
    g = lambda row, m: _f(row["model"].get(m), 0)  # noqa: E731
    return [
        "### Projection to 256 and 1,024 nodes", "",
        f"Measured: the rows above, {sizes[0]} to {sizes[-1]} nodes. Modelled: the columns at 256 and 1,024, "
        "a straight line through the measured sizes, and the limits below, which come from the code's "
        "settings and the tools' documented behaviour. Below 20 nodes every host fits in one round of "
        "Ansible's forks, so the measured slope is this 2-core controller's CPU per host (one forked "
        "worker, one module or raw command, one event per host and task), not a fork limit.", "",
        f"- **Ansible forks (`forks = 20` in ansible.cfg) break first for `setup`.** Past 20 hosts each task "
        f"runs in ceil(N/20) rounds: 13 at 256 nodes, 52 at 1,024. The line gives a first converge of "
        f"{g(st1, 256)} s and {g(st1, 1024)} s and a re-run of {g(st2, 256)} s and {g(st2, 1024)} s; with the "
        "rounds, expect more. Raising `forks` (ANSIBLE_FORKS) moves it until the controller's cores and "
        "memory (a worker process per fork) are the limit; a controller with more cores is the real setting.",
        f"- **`check` and a run's preflight are one play too**, so the same fork rounds apply to them: the "
        f"line gives `check` {g(chk, 256)} s and {g(chk, 1024)} s. Inside the probe, the full set (`check` "
        "only) logs in from every node to every other (N(N−1) ssh logins: 65,280 at 256 nodes, 1,047,552 "
        "at 1,024), at most 4 at a time per node in ring order (`SSH_FAN_OUT`), so each sshd sees about 4 "
        "pending connections, under `MaxStartups` 10; each node's (N−1)/4 waves of about one login's time "
        "(0.1–0.3 s here) make about 13 s at 256 nodes and 50 s at 1,024, against the preflight's ssh "
        "timeout per login, not a deadline for all. The port probe of the full set also opens N(N−1) TCP "
        "connections (every node to every other on Open MPI's range) with one deadline "
        "(`preflight_net_timeout`, 8 s): at 1,024 nodes each node makes 1,023 calls and accepts as many, "
        "which is what breaks first inside `check` (raise the timeout, or sample the pairs). `train`'s "
        "preflight opens N−1 (every node to the head's rendezvous port) and the head's N−1 ssh banner "
        "checks: linear, and the head's listener backlog and sshd `MaxStartups` set its limit.",
        f"- **mpirun's launch tree.** Open MPI's rsh launcher starts its daemons by tree spawn, at most "
        "`plm_rsh_num_concurrent` (128) ssh sessions at a time per launching daemon, so its own start grows "
        f"with log N; the launch overhead's slope here ({_f(ovh['slope'], 3)} s per node) is mostly distrun's "
        f"play and the per-node launch and follow, which the line gives as {g(ovh, 256)} s and "
        f"{g(ovh, 1024)} s of overhead. torchrun starts one agent per node from the controller over the "
        "ssh master distrun opens per node: N ssh masters on the controller (file descriptors, sshd "
        "`MaxStartups` on nobody but each node: one each).",
        f"- **Record sizes** grow with N: a train run's record (ansible-runner's events hold one per host "
        f"and task) is modelled at {g(rec, 256)} KiB and {g(rec, 1024)} KiB; `check --json` grows with "
        "checks x nodes. Neither is a limit at 1,024 nodes.",
        "- **What moves it**: `forks` and the controller's cores for every play; `preflight_net_timeout` "
        "and `preflight_ssh_timeout` for the full `check`; `SSH_FAN_OUT` in the probe against the nodes' "
        "`MaxStartups`; `plm_rsh_num_concurrent` for mpirun.",
    ]
