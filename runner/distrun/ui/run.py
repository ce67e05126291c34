"""The terminal view of train, partition and stop: progress, epochs, the run summary with its
hints, stop counts per node, and the dry run's text."""

from __future__ import annotations

import os
import shlex
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from distrun.errors import UserError
from distrun.launchers import launcher_named
from distrun.launchers.options import option_lines
from distrun.planning.dryrun import DryRun
from distrun.planning.jobplan import to_json
from distrun.project.ready import size_text
from distrun.project.workdir import Scan, SyncStats
from distrun.run.diagnosis import RunSummary, epoch
from distrun.run.listener import EventHandler, Listener
from distrun.run.liveness import ClusterState
from distrun.run.reconcile import RunView
from distrun.run.stop import StopReport
from distrun.store.runs import Run, RunStatus
from distrun.transport.playbook_events import PlaybookResult
from distrun.ui.console import PlaybookProgress, console, err_console, print_summary, styled, warn


class TrainView(Listener):
    """Says what a run does as it goes (train.Listener, on the console)."""

    run: Run | None = None  # the run's record, once it exists

    def started(self, run: Run) -> None:
        self.run = run
        console.print(f"run {run.id}: record in {run.dir}", markup=False, soft_wrap=True)

    def playbook(self, title: str, hosts: list[str]) -> AbstractContextManager[EventHandler | None]:
        return PlaybookProgress(title, hosts)

    def playbook_failed(self, result: PlaybookResult, elapsed: float) -> None:
        print_summary(result, elapsed)

    def replanning(self) -> None:
        console.print("[yellow]the nodes' network changed since the last run: planning again[/yellow]")

    def waiting(self, text: str) -> None:
        console.print(text, markup=False, soft_wrap=True)

    def line(self, text: str) -> None:
        e = epoch(text)
        if e is not None:
            try:
                console.print(
                    f"epoch {e.get('epoch')}/{e.get('epochs')}  loss {e.get('loss', 0):.4f}  "
                    f"train_acc {e.get('train_acc', 0):.3f}  val_acc {e.get('val_acc', 0):.3f}  "
                    f"{e.get('epoch_time_s', 0) * 1000:.0f} ms/epoch",
                    markup=False, soft_wrap=True,
                )
                return
            except (ValueError, TypeError):
                pass
        # Never wrapped, on a terminal too: a DISTRUN_RESULT line is read back as one line.
        console.print(text, markup=False, soft_wrap=True)

    def workdir_synced(self, host: str, scan: Scan, stats: SyncStats) -> None:
        deleted = f", {stats.deleted} deleted" if stats.deleted else ""
        console.print(f"workdir: {scan.files} files ({size_text(scan.bytes)}) in sync on {host}: "
                      f"{stats.files_transferred} sent{deleted} in {stats.seconds:.1f}s", markup=False)

    def prepare_started(self, host: str, argv: tuple[str, ...]) -> None:
        console.print(f"prepare on {host}: {shlex.join(argv)}", markup=False)

    def prepare_line(self, text: str) -> None:
        console.print(f"  prepare| {text}", markup=False, soft_wrap=True)

    def node_failed(self, reason: str) -> None:
        err_console.print(styled((f"{reason}: stopping every rank on every node", "red")), soft_wrap=True)

    def restarting(self, restart: int, max_restarts: int, hosts: list[str], reason: str) -> None:
        err_console.print(styled((f"{reason}: restart {restart} of {max_restarts} on {', '.join(hosts)}", "yellow")),
                          soft_wrap=True)

    def not_restarting(self, reason: str) -> None:
        warn(f"not restarting: {reason}")

    def detached(self, run: Run, state: ClusterState) -> None:
        hosts = ", ".join(h for h, s in state.hosts.items() if s.started)
        console.print(f"{len(state.started)} of {state.world_size} rank(s) started on {hosts}: the run goes on by itself",
                      markup=False)
        console.print(f"follow it: distrun attach {run.id}  |  distrun status {run.id}  |  distrun logs -f {run.id}  "
                      f"|  distrun stop {run.id}", markup=False, soft_wrap=True)
        console.print(run.id, markup=False)

    def attached(self, run: Run) -> None:
        console.print(f"attached to run {run.id}: following it to its end (Ctrl-C leaves it running)", markup=False)

    def already_ended(self, run: Run) -> None:
        console.print(f"run {run.id} already ended: {run.meta.status} ({run.meta.summary}); 'distrun logs {run.id}' "
                      "shows its output", markup=False, soft_wrap=True)

    def contact_lost(self, run: Run, reason: str) -> None:
        warn(f"lost contact with the run's nodes ({reason}); the run may still be going: its record stays open. "
             f"When the nodes answer again: 'distrun status {run.id}', 'distrun attach {run.id}'")

    def interrupted(self) -> None:
        err_console.print("[yellow]interrupted: stopping every rank on every node[/yellow]")

    def warn(self, message: str) -> None:
        warn(message)

    def finished(self, summary: RunSummary) -> None:
        console.print(f"per-rank logs: {summary.logs_collected} of {summary.world_size} collected under "
                      f"{summary.logs_dir}", markup=False, soft_wrap=True)
        if summary.left_files:
            console.print(f"left on the nodes: {summary.left_files} bigger file(s), {summary.left_bytes / (1 << 20):.1f} MiB "
                          f"(listed in left-on-nodes.json; 'distrun fetch {summary.run_id} PATH' brings them)",
                          markup=False, soft_wrap=True)
        if summary.ok:
            console.print(styled((f"run {summary.run_id} succeeded", "green"), f" in {summary.elapsed:.1f}s{summary.accuracy}"),
                          soft_wrap=True)
            return
        console.print(styled((f"run {summary.run_id} failed", "red"), f" (launcher exit {summary.rc}) after "
                             f"{summary.elapsed:.1f}s{summary.failure}"), soft_wrap=True)
        for fix in summary.hints:
            console.print(f"  hint: {fix}", markup=False, soft_wrap=True)


def state_text(view: RunView) -> str:
    """One word or two for a run's state in 'distrun runs': live states say they were checked."""
    if view.state == RunStatus.RUNNING:
        return "running" if view.followed else "running (live)"
    return view.state


def print_status(view: RunView) -> None:
    """'distrun status': the run's state, then each rank host as its probe answered."""
    rc = "" if view.rc is None else f", exit code {view.rc}"
    console.print(f"run {view.run.id}: {view.state}{rc}", markup=False)
    if view.detail:
        console.print(f"  {view.detail}", markup=False, soft_wrap=True)
    meta = view.run.meta
    if meta.max_restarts:
        console.print(f"  restarts: {meta.restarts} of {meta.max_restarts}", markup=False)
    if view.cluster is not None:
        for host, s in view.cluster.hosts.items():
            console.print(f"  {host}: {s.text()}", markup=False, soft_wrap=True)


def print_stop_report(report: StopReport) -> None:
    if report.followed_by:
        console.print(f"run {report.run_id}: the distrun process that ran it ({report.followed_by}) stopped it",
                      markup=False, soft_wrap=True)
    for host, n in report.stopped.items():
        console.print(f"  {host}: stopped {n} process(es)", markup=False)
    for host, why in report.missed.items():
        err_console.print(f"  {host}: NOT stopped: {why}", markup=False, soft_wrap=True)
    if not report.missed:
        total = sum(report.stopped.values())
        console.print(f"run {report.run_id}: stopped {total} process(es) on {len(report.stopped)} node(s)", markup=False)


def dry_run_json(dry: DryRun) -> dict[str, Any]:
    """--dry-run --json: the plan, every file the run renders and every launch script."""
    plan = to_json(dry.plan)
    options = {name: {"value": r.value, "from": r.origin} for name, r in dry.options.items()}
    return {"schema": 1, "dry_run": True, "inventory": str(dry.cluster.source), "plan": plan, "files": dry.files,
            "launch_scripts": dry.scripts, "env_file_keys": list(dry.plan.program.user_env_keys), "note": dry.note,
            "launcher_options": options, "left_out": list(dry.left_out),
            "gpus": [{**asdict(r), "gpus": list(r.gpus)} for r in dry.gpus], "gpus_first_free": list(dry.first_free),
            "exit_code": 0, "error": None}


def dry_run_refused(inventory: Path, exc: UserError) -> dict[str, Any]:
    """--dry-run --json of a plan the inventory or the request refused: the one-line refusal and
    the exit code, for a script that reads stdout only."""
    return {"schema": 1, "dry_run": True, "inventory": str(inventory), "plan": None, "exit_code": exc.exit_code,
            "error": str(exc)}


def gpu_lines(dry: DryRun) -> list[str]:
    """The dry run's GPU mapping: per rank its host, rank, local rank, own GPUs and
    CUDA_VISIBLE_DEVICES ([] where the run maps no GPU)."""
    if not dry.gpus:
        return []
    hosts = {h.name: h for h in dry.plan.placement.hosts}
    out = ["gpus (nvidia-smi's indices, CUDA_DEVICE_ORDER=PCI_BUS_ID):",
           f"  {'host':<16} {'rank':>5} {'local rank':>11}  {'gpus':<12} CUDA_VISIBLE_DEVICES"]
    for r in dry.gpus:
        own = ",".join(map(str, r.gpus)) or "-"
        h = hosts[r.host]
        if r.visible is None and h.gpu_ids:
            visible = f"the scheduler's ({len(h.gpu_ids)} per node)"
        elif r.visible is None:
            visible = f"the node's (all {h.gpus})" if h.gpus else "- (no GPU)"
        else:
            visible = r.visible or '"" (none)'
        rank = "-" if r.rank is None else str(r.rank)
        out.append(f"  {r.host:<16} {rank:>5} {r.local_rank:>11}  {own:<12} {visible}")
    if dry.first_free:
        n = len(hosts[dry.first_free[0]].gpu_ids)
        out.append(f"gpus at launch: {', '.join(dry.first_free)}: the first {n} shown; train takes the first {n} free "
                   f"there at launch (no other run's; the dry run asks no node)")
    return out


def dry_run_text(dry: DryRun) -> str:
    """--dry-run: the plan, every file the run renders and every launch script, as plain text."""
    cluster, plan = dry.cluster, dry.plan
    source = str(cluster.source)
    shown = os.path.relpath(source) if source.startswith(os.getcwd()) else source
    out: list[str] = [f"# distrun train --dry-run  (inventory: {shown})"]
    out.append(f"launcher:    {plan.launch.launcher}")
    if dry.options:
        out.append("launcher options:")
        out += option_lines(dry.options, launcher_named(plan.launch.launcher).options)
    out.append(f"world size:  {plan.placement.world_size} rank(s) on {len(plan.placement.hosts)} host(s)")
    out.append(f"training user: {plan.launch.user}    env prefix: {plan.launch.env_prefix}    mpi prefix: {plan.launch.mpi_prefix}")
    out.append(f"run dir:     {plan.run_dir}")
    if plan.launch.container:
        out.append(f"container:   {plan.launch.container.runtime} image {plan.launch.container.image} (every rank inside it)")
    net = plan.placement.cidr or ("the site's: distrun contacts only the login node" if plan.placement.login
                        else "not detected yet (run 'distrun check' or 'distrun setup' to gather facts)")
    out.append(f"network:     {net}")
    if dry.note:
        out.append(f"note:        {dry.note}")
    out.append("hosts:")
    for h in plan.placement.hosts:
        node = next(n for n in cluster.workers if n.name == h.name)
        address = h.address or "(Slurm picks)"
        out.append(f"  {h.name:<16} {address:<16} ranks={h.slots} (slots from {node.slots_source}) gpus={h.gpus} iface={h.iface or '-'}")
    out += [f"  {line}" for line in dry.left_out]
    out += gpu_lines(dry)
    if dry.project is not None:
        s = dry.project.scan
        out.append(f"workdir:     {dry.project.local} -> {plan.program.workdir} ({s.files} files, {size_text(s.bytes)}; "
                   f"ignore files: {', '.join(s.ignore_files) or 'none'})")
    for title, command in dry.before.items():
        out.append("")
        out.append(f"# {title}")
        out.append(command)
    if plan.program.partition:
        out.append("")
        out.append("# partition (on the head node, skipped when its manifest already matches)")
        out.append(shlex.join(plan.program.partition))
    for name, text in dry.files.items():
        out.append("")
        out.append(f"# {plan.run_dir}/{name}")
        out.append(text.rstrip("\n"))
    if plan.program.user_env_keys:
        out.append("")
        out.append(f"# {plan.env_file} (0600, values not shown): {' '.join(plan.program.user_env_keys)}")
    for host, text in dry.scripts.items():
        out.append("")
        out.append(f"# launch on {host}")
        out.append(text.rstrip("\n"))
    return "\n".join(out) + "\n"
