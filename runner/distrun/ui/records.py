"""The terminal view of run records: the ``runs`` table and ``show``'s account of one run
(the same data as their ``--json``, from records.py)."""

from __future__ import annotations

import datetime
import json
import shlex
from typing import Any

from distrun.ui.console import console, print_table


def _local(iso: str | None) -> str:
    if not iso:
        return ""
    return datetime.datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S")


def print_runs(listing: dict[str, Any]) -> None:
    rows = [[r["run_id"], r["verb"], r["status"], "" if r["rc"] is None else str(r["rc"]),
             "" if r["duration_s"] is None else f"{r['duration_s']:.1f}s", r["inventory"],
             "; ".join(t for t in [r["summary"], *(f"drained {n}: {why}" for n, why in r.get("drained", {}).items())] if t)]
            for r in listing["runs"]]
    # Run id and status are never cut; the summary wraps; on a narrow terminal the inventory goes
    # first, then the duration, the verb, the exit code and the summary (docs/guide/cli.md).
    print_table(["run", "verb", "status", "rc", "duration", "inventory", "summary"], rows,
                keep=(0, 2), drop=(5, 4, 1, 3, 6), wrap=(6,))


def show_lines(d: dict[str, Any]) -> list[str]:
    """``distrun show RUN``: one fact per line, paths and commands whole."""
    rc = "" if d["rc"] is None else f" (exit {d['rc']})"
    lines = [
        f"run:        {d['run_id']}",
        f"verb:       {d['verb']}",
        f"status:     {d['status']}{rc}",
        f"inventory:  {d['inventory']}",
        f"started:    {_local(d['started'])}",
    ]
    if d["finished"]:
        lines.append(f"finished:   {_local(d['finished'])} ({d['duration_s']:.1f}s)")
    if d["summary"]:
        lines.append(f"summary:    {d['summary']}")
    for node, why in d.get("drained", {}).items():
        lines.append(f"drained:    {node}, by this run: {why} (a 'distrun check' that passes on it, or "
                     f"'distrun check --clear {node}', brings it back)")
    lines.append(f"record:     {d['dir']}")
    plan = d.get("plan")
    if plan:
        hosts = ", ".join(f"{h['name']} ({h['ranks']})" for h in plan["hosts"])
        lines.append(f"launcher:   {plan['launcher']}, {plan['world_size']} rank(s) on {hosts}")
        lines.append(f"run dir:    {plan['run_dir']} (on the nodes)")
        if plan.get("program"):
            lines.append(f"program:    {shlex.join(str(a) for a in plan['program'])}")
    image = d.get("image")
    if image:
        ids = sorted({str(i) for i in image["nodes"].values()})
        seen = ids[0] if image["same"] else ", ".join(f"{h} {i or 'not probed'}" for h, i in image["nodes"].items())
        lines.append(f"image:      {image['ref']} ({image['runtime']}): {seen}")
    if d.get("result"):
        lines.append(f"result:     {json.dumps(d['result'], sort_keys=True)}")
    timings = d.get("timings")
    if timings:
        spans = ", ".join(f"{p['name']} {p['s']:.1f}s" for p in timings.get("phases", []))
        lines.append(f"timings:    {spans} (total {timings.get('total_s', 0):.1f}s)")
    lines += _starts_lines(d.get("starts"))
    lines += _supervisor_lines(d.get("supervisor"))
    commands = d["commands"]
    if commands["partition"]:
        lines.append(f"partition:  {shlex.join(commands['partition'])}")
    for host, argv in commands["launch"].items():
        lines.append(f"launch on {host}: {shlex.join(argv)}")
    if commands["file"]:
        lines.append(f"commands:   {commands['file']}")
    logs = d["logs"]
    if logs["launcher"]:
        lines.append(f"log:        {logs['launcher']}")
    for rank, path in logs["ranks"].items():
        lines.append(f"rank {rank} log: {path}")
    if logs["ansible"]:
        lines.append(f"ansible:    {logs['ansible']}")
    return lines


def _supervisor_lines(record: dict[str, Any] | None) -> list[str]:
    """A detached mpirun run's tries on the head, labelled as the supervisor's report (run/supervision.py)."""
    if not record or not record["tries"]:
        return []
    lines = []
    for t in record["tries"]:
        end = "running" if t["ended"] is None else (f"stopped by signal {t['signal']}" if t["signal"] else f"exit {t['rc']}")
        lines.append(f"try {t['try']}:      on {', '.join(t['hosts'])}: {end}" + (f"; {t['decision']}" if t["decision"] else ""))
    lines.append(f"            (as the supervisor on the head reported them: {record['state']}"
                 + (f", {record['reason']})" if record["reason"] else ")"))
    return lines


def _starts_lines(starts: dict[str, Any] | None) -> list[str]:
    """A self-restarting run's starts per node, labelled as the job's own report (run/starts.py)."""
    if not starts or not starts["hosts"]:
        return []
    per_host = "; ".join(f"{h} {s['starts']} time(s)" for h, s in starts["hosts"].items())
    lines = [f"starts:     {per_host} (in attempt {starts['attempt']}, as the job's rank wrapper reported them)",
             f"ended on:   restart {starts['ended_on_restart']} (DISTRUN_RESTART of the last start, as reported)"]
    if starts["unreadable_files"]:
        lines.append(f"            {starts['unreadable_files']} starts file(s) left out: not the rank wrapper's")
    return lines


def print_show(d: dict[str, Any]) -> None:
    for line in show_lines(d):
        console.print(line, markup=False, soft_wrap=True)
