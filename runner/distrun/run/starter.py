"""The launchers of an attempt started as soon as every node of the run is staged (``Starter``),
while ansible-playbook is still ending: on the facts run.yml publishes, each node's stage answer
read from its task's output, the judge's verdict awaited where the probes staged the attempt.
Each start is one call of role job's launch.py per launch host, over that node's ssh connection;
what it reaches goes to the attempt's state machine (attempt.py): judged, staged, launched or
launch failed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping

from distrun.inventory.cluster import Cluster, Node
from distrun.launchers import launcher_named
from distrun.planning.jobplan import JobPlan
from distrun.run.attempt import Attempt
from distrun.run.attempt_shell import launch_command
from distrun.transport import nodeprog
from distrun.transport.handshake import PREFLIGHT_FACT, STAGED_FACT
from distrun.transport.playbook_events import PlaybookEvent
from distrun.transport.remote import run_each


def launch(cluster: Cluster, plan: JobPlan, hosts: list[str], timeout_s: float = 60) -> dict[str, str]:
    """Start the launcher on every launch host at once, each over its node's ssh connection (run.yml
    left it open); host -> why, for those where it did not start."""
    nodes: dict[str, Node] = {n.name: n for n in cluster.nodes}
    done = run_each(nodes, {h: launch_command(plan, h) for h in hosts}, timeout_s)
    failed: dict[str, str] = {}
    for h, d in done.items():
        said = nodeprog.answer(d.out, "launch")
        if d.rc == 0 and said and said.get("launched") is True:
            continue
        failed[h] = str(said["error"]) if said and said.get("error") else d.last_line()
    return failed



def _answer(event: PlaybookEvent, marker: str = '"stage') -> dict:
    """What a node's stage script or probe printed last (its stdout's last line, a JSON object),
    where that output holds ``marker`` (read only then: most tasks print nothing of ours)."""
    out = event.data.get("stdout") if event.kind in ("ok", "changed") else None
    if not isinstance(out, str) or marker not in out:
        return {}
    try:
        said = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return said if isinstance(said, dict) else {}


def staged_run(event: PlaybookEvent) -> str | None:
    """The run a node's stage script (its stdout: {"changed": .., "staged": RUN}) or its probe,
    staging a first attempt in the same round trip, says it unpacked."""
    said = _answer(event)
    return str(said["staged"]) if "staged" in said else None


def probed_image(event: PlaybookEvent) -> dict | None:
    """The container image a node's probe found (its ``image``: ref, runtime, user, id), if any."""
    image = _answer(event, '"image"').get("image")
    return image if isinstance(image, dict) else None


class Starter:
    """Starts an attempt's launchers, in a thread, as soon as every node of the run is staged, so
    they start while ansible-playbook is ending: when each node that stages reported the run
    unpacked (the stage script's answer, or the probe's where it staged in its round trip) and,
    given ``judged``, once the judge passed (its verdict fact arrives with its task's ok: run.yml's
    judge fails the play on any node it blames); or, where the stage step has steps after
    unpacking (``after_steps``), when run.yml publishes STAGED_FACT after them. A node that fails
    or drops out of the play before that never reports: nothing is started then."""

    def __init__(self, cluster: Cluster, plan: JobPlan, stage_hosts: Iterable[str] = (), after_steps: bool = True,
                 judged: bool = False, attempt: Attempt | None = None) -> None:
        self.cluster, self.plan = cluster, plan
        self.attempt = attempt or Attempt(0)  # told: judged, staged, launched
        self.waiting = None if after_steps else set(stage_hosts)
        self.judging = judged  # waiting for the judge's verdict
        self.stage_errors: dict[str, str] = {}  # host -> why its probe did not stage the run
        self.created: dict[str, list[str]] = {}  # host -> the run's folders its probe's stage step made
        self.thread: threading.Thread | None = None
        self.failed: dict[str, str] = {}
        self.images: dict[str, str] = {}  # host -> the id of the run's image its probe found

    @property
    def started(self) -> bool:
        return self.thread is not None

    def on_event(self, event: PlaybookEvent) -> None:
        facts = event.data.get("ansible_facts") if event.kind in ("ok", "changed") else None
        if isinstance(facts, Mapping) and facts.get(STAGED_FACT) is True:
            self.start()
            return
        if isinstance(facts, Mapping) and PREFLIGHT_FACT in facts:
            self.judging = False
        if PREFLIGHT_FACT in (event.data.get("ansible_facts") or {}):  # passed, or failing the nodes it blames
            self.attempt.judged()
        if self.plan.launch.container and (image := probed_image(event)) and image.get("id"):
            self.images[str(event.host)] = str(image["id"])
        said = _answer(event)
        if said.get("stage_created"):
            self.created[str(event.host)] = [str(d) for d in said["stage_created"]]
        if self.waiting and event.host in self.waiting:
            if staged_run(event) == self.plan.run_id:
                self.waiting.discard(event.host)
            elif "stage_error" in said:
                self.stage_errors[event.host] = str(said["stage_error"])
        if self.waiting is not None and not self.waiting and not self.judging:
            self.start()

    def made(self, *own: str) -> dict[str, list[str]]:
        """Host -> the folders its probe said it made, of ``own`` (the run dir and checkpoint dir
        of this plan) only: nothing else is ever removed, whatever a node answered."""
        return {h: [d for d in dirs if d and d in own] for h, dirs in self.created.items()}

    def unstaged(self) -> dict[str, str]:
        """Host -> why, for the nodes that stage and did not say they unpacked this run."""
        return {h: self.stage_errors.get(h, "it did not say it unpacked the run") for h in sorted(self.waiting or ())}

    def start(self) -> None:
        if self.thread is None:
            self.attempt.staged()
            hosts = [h.name for h in launcher_named(self.plan.launch.launcher).started_hosts(self.plan)]
            self.thread = threading.Thread(target=self._launch, args=(hosts,), daemon=True)
            self.thread.start()

    def _launch(self, hosts: list[str]) -> None:
        self.failed.update(launch(self.cluster, self.plan, hosts))
        if self.failed:
            self.attempt.launch_failed("; ".join(f"{h}: {why}" for h, why in sorted(self.failed.items())))
        else:
            self.attempt.launched()

    def wait(self) -> dict[str, str]:
        """Host -> why, for the launchers that did not start (started now if run.yml succeeded
        without publishing the fact, unless a node that stages did not unpack the run)."""
        if not self.unstaged():
            self.start()
        self.join()
        return self.failed

    def join(self) -> None:
        """Wait for the launchers being started, if any (each start ends within its timeout)."""
        if self.thread is not None:
            self.thread.join()
