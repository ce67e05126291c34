"""A launched run to its end: follow its ranks, stop what is left, bring its files home, sum it
up in the record. 'distrun train' does this after each launch (and between restarts);
'distrun attach' does it for a run it takes over."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from distrun.errors import UserError
from distrun.inventory.cluster import Cluster
from distrun.launchers import launcher_named
from distrun.planning.bundle import common_vars
from distrun.planning.jobplan import JobPlan
from distrun.run.collect import Failure, collect_hosts, pull_run
from distrun.run.collect_rules import LEFT_FILE, SMALL_BYTES, Left, left_record, run_end_selection
from distrun.run.diagnosis import NodeFailure, RunSummary, summarise
from distrun.run.follow import Outcome, follow
from distrun.run.listener import Listener
from distrun.run.stop import stop_play
from distrun.store import drained
from distrun.store.runs import Run
from distrun.transport import nodeprog
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.remote import node_command, run_each

# Why a node the follower's ssh session lost is drained (follow.Outcome.lost: ssh's own failure).
LOST_MID_RUN = "lost mid-run: ssh to it failed"
# Lines the runner keeps in memory to read the result and the failure from (the rest is in launcher.log).
KEEP_LINES = 4000


def collect_limits() -> dict[str, int]:
    """Bytes, files, entries (files and folders), folders deep and seconds one node's collect may
    take: DISTRUN_COLLECT_MAX_MB, DISTRUN_COLLECT_MAX_FILES, DISTRUN_COLLECT_MAX_ENTRIES,
    DISTRUN_COLLECT_MAX_DEPTH and DISTRUN_COLLECT_TIMEOUT_S on the controller, else the defaults."""
    limits: dict[str, int] = {}
    for var, key, scale in (("DISTRUN_COLLECT_MAX_MB", "max_bytes", 1 << 20), ("DISTRUN_COLLECT_MAX_FILES", "max_files", 1),
                            ("DISTRUN_COLLECT_MAX_ENTRIES", "max_entries", 1),
                            ("DISTRUN_COLLECT_MAX_DEPTH", "max_depth", 1),
                            ("DISTRUN_COLLECT_TIMEOUT_S", "timeout_s", 1)):
        text = os.environ.get(var)
        if text:
            if not text.isdigit() or int(text) == 0:
                raise UserError(f"{var}={text!r}: give a positive whole number")
            limits[key] = int(text) * scale
    return limits


class RunEnd:
    """The end of one run, as one controller sees it: the lines it followed, what it stopped."""

    def __init__(self, run: Run, inventory: Path, listener: Listener) -> None:
        self.run = run
        self.inventory = inventory
        self.listener = listener
        self.lines: list[str] = []
        self.failure: NodeFailure | None = None  # the node that ended the run, as the runner saw it
        self.followed = 0  # follows so far: the first starts launcher.log afresh, later ones append
        self.left: dict[str, Left] = {}  # host -> the files collect left there

    def follow(self, cluster: Cluster, plan: JobPlan) -> Outcome:
        """Follow the launchers until the head's exits or a node fails; launcher.log gets every line."""
        launch_hosts = [h.name for h in launcher_named(plan.launch.launcher).launch_hosts(plan)]
        with (self.run.dir / "launcher.log").open("a" if self.followed else "w") as log:
            if self.followed:
                log.write(f"DISTRUN_RESTART {plan.attempt.restart}\n")
            self.followed += 1

            def on_line(text: str) -> None:
                log.write(text + "\n")
                log.flush()
                self.lines.append(text)
                if len(self.lines) > KEEP_LINES:
                    del self.lines[:KEEP_LINES // 2]
                self.listener.line(text)

            return follow(cluster, plan, launch_hosts, on_line)

    def stop(self, plan: JobPlan, hosts: list[str]) -> set[str]:
        """Stop every process of the run on hosts; the hosts that could not be reached (drained
        when another answered)."""
        if not hosts:
            return set()
        unreachable = stop_play(self.run, self.inventory, plan, hosts).unreachable
        self.drain_lost(unreachable, set(hosts) - unreachable, "lost: the run's stop step could not reach it")
        return unreachable

    def drain_lost(self, lost: Iterable[str], answered: Iterable[str], why: str) -> None:
        """Drain the nodes this run lost (store/drained.py, source ``run <id>``), each said once
        and kept in the record. Only while another node of the run answered this controller: a
        network lost here drains no node. ``why`` is the controller's own finding (ssh to the node
        failed, a stop could not reach it), never what a node or the job printed."""
        if not set(answered) - set(lost):
            return
        for node in sorted(set(lost) - set(self.run.meta.drained)):
            try:
                mark = drained.drain(self.inventory, node, why, f"run {self.run.id}")
            except (UserError, OSError) as exc:  # the run still ends as it would: stopped, collected, summed up
                self.listener.warn(f"{node} was lost but is not drained: {exc}")
                continue
            self.run.meta.drained[node] = mark.reason
            self.run.save()
            self.listener.warn(f"drained: {mark.line()}")

    def collect(self, cluster: Cluster, plan: JobPlan, hosts: list[str], lost: set[str]) -> None:
        """Bring the run's logs, exit codes and small files home from hosts (every rank host in
        sync mode, else the head), leaving out the lost ones; list what stays on the nodes in the
        record; say what could not be brought."""
        dest = self.run.dir / "nodes"
        dest.mkdir(exist_ok=True, mode=0o700)
        hosts = [h for h in collect_hosts(cluster, hosts) if h not in lost]
        selection = run_end_selection()
        pulled = pull_run(cluster, plan.run_dir, hosts, dest, selection, **collect_limits())
        failed = pulled.errors
        for h, e in failed.items():
            if e.kind in (Failure.REFUSED, Failure.CAPPED):
                what = "refused" if e.kind == Failure.REFUSED else "incomplete"
                self.listener.warn(f"collect from {h} {what}: {e.why}")
        retry = [h for h in failed if not failed[h].final]
        lost_msgs = [f"{h} (lost during the run)" for h in sorted(lost)]
        lost_msgs += [f"{h} ({e.why})" for h, e in failed.items() if e.kind == Failure.UNREACHABLE]
        if retry:
            # Whatever a tar over ssh could not bring from a reachable node, the playbook tries file by file.
            result = run_playbook("playbooks/collect.yml", self.inventory, self.run.dir,
                                  extravars={**common_vars(plan), "distrun_collect_dest": str(dest),
                                             "distrun_collect_keep": selection.regex(),
                                             "distrun_collect_never": selection.never_regex(),
                                             "distrun_collect_small_bytes": SMALL_BYTES},
                                  limit=",".join(retry))
            lost_msgs += [f"{h.name} ({h.last_error})" for h in result.failures()]
        if lost_msgs:
            self.listener.warn(f"logs not collected from: {', '.join(lost_msgs)}")
        self.left = pulled.left
        if pulled.left:
            self.run.write(LEFT_FILE, left_record(plan.run_dir, pulled.left))
        self.run.meta.collected = True
        self.forget_env(cluster, plan, hosts)

    def forget_env(self, cluster: Cluster, plan: JobPlan, hosts: list[str]) -> None:
        """The run has ended: its --env values leave the nodes (another run of the training
        account could read them there); the record keeps its own 0600 copy on this machine."""
        if not plan.program.user_env_keys:
            return
        nodes = {n.name: n for n in cluster.nodes if n.name in hosts}
        # Root with the training user's rights where the connection can be root (role job's files.py).
        done = run_each(nodes, dict.fromkeys(nodes, node_command(
            plan.launch.user, "remove", {"user": plan.launch.user, "run": plan.run_id, "paths": [plan.env_file]}, "files",
            people=plan.launch.people)), 30)
        kept = sorted(h for h, d in done.items()
                      if d.rc != 0 or ((nodeprog.answer(d.out, "remove") or {"kept": [h]}).get("kept")))
        if kept:
            self.listener.warn(f"the run's env.sh (its --env values) could not be removed on {', '.join(kept)}: "
                               f"remove {plan.env_file} there")

    def summarise(self, rc: int, elapsed: float, plan: JobPlan) -> int:
        """Read what the run printed and what was collected; the record's last word; distrun's exit code."""
        summary: RunSummary = summarise(self.run.id, rc, elapsed, self.lines, launcher_named(plan.launch.launcher),
                                        plan.placement.world_size, self.run.dir / "nodes", self.failure)
        summary.left_files = sum(len(e.files) for e in self.left.values())
        summary.left_bytes = sum(e.size for e in self.left.values())
        if summary.result is not None:
            self.run.write("result.json", json.dumps(summary.result, indent=2) + "\n")
        text = summary.text
        if self.run.meta.restarts:
            text += f" after {self.run.meta.restarts} restart(s)"
        self.run.finish(summary.exit_code, text)
        self.listener.finished(summary)
        return summary.exit_code
