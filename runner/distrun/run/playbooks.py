"""The playbooks of a run, as its attempts start them: each with progress through the listener,
run.yml taken over from the ansible-playbook started before the run was planned (``early``) when
it is the playbook asked for, the facts gathered for a run's first plan, and a failed preflight
told in the one line 'distrun check' uses."""

from __future__ import annotations

import time

from distrun import paths
from distrun.errors import ExitCode, UserError
from distrun.inventory.cluster import Cluster
from distrun.planning.request import JobRequest
from distrun.preflight import nodefacts, sshmesh
from distrun.preflight.check import preflight_refusal, preflight_vars
from distrun.run.listener import EventHandler, Listener
from distrun.store.runs import Run as Record
from distrun.transport import handshake as hs
from distrun.transport.ansible_bridge import run_playbook
from distrun.transport.early_playbook import EarlyPlaybook
from distrun.transport.playbook_events import PlaybookEvent, PlaybookResult


class RunPlaybooks:
    """A run's playbooks: the request's inventory, the record's folder for ansible-runner, the
    listener, and run.yml's early start (taken by the first playbook that is run.yml)."""

    def __init__(self, request: JobRequest, record: Record, listener: Listener, early: EarlyPlaybook | None) -> None:
        self.request, self.record, self.listener, self.early = request, record, listener, early

    def cancel_early(self) -> None:
        """The early ansible-playbook, where no playbook took it: stopped, having run nothing."""
        if self.early is not None:
            self.early.cancel()
            self.early = None

    def run(self, title: str, playbook: str, hosts: list[str], extravars: dict, limit: str | None = None,
            cached_facts: bool = False, also: EventHandler | None = None, skip_tags: str | None = None) -> PlaybookResult:
        """Run a playbook with progress; ``also`` sees every event too."""
        started = time.monotonic()
        with self.listener.playbook(title, hosts) as on_event:

            def both(event: PlaybookEvent) -> None:
                # run.yml's judge failing the play is told by the refusal line, with the verdict.
                judged = event.kind == "failed" and hs.PREFLIGHT_FACT in (event.data.get("ansible_facts") or {})
                if on_event is not None and not judged:
                    on_event(event)
                if also is not None:
                    also(event)

            early, self.early = self.early, None
            if early is not None and early.playbook != playbook:
                early.cancel()  # another playbook comes first (a first run gathers facts): run.yml starts as usual
                early = None
            result = early.run(extravars=extravars, on_event=both, limit=limit, cached_facts=cached_facts,
                               skip_tags=skip_tags) if early is not None else None
            if result is None:
                result = run_playbook(playbook, self.request.inventory, self.record.dir, extravars=extravars,
                                      on_event=both, limit=limit, cached_facts=cached_facts, skip_tags=skip_tags)
        # A failed preflight is told in one line by the same judge as 'distrun check' (refusal);
        # an interrupted playbook by the run's end.
        if not result.ok and result.status != "canceled" and not (
                result.fact(hs.PREFLIGHT_FACT) is not None and hs.failed_step(result) == "preflight"):
            self.listener.playbook_failed(result, time.monotonic() - started)
        return result

    def preflight_vars(self) -> dict:
        return {"preflight_ports": [self.request.placement.port],
                **preflight_vars(str(self.request.inventory), self.record.dir)}

    def gather(self, cluster: Cluster) -> PlaybookResult:
        """The preflight playbook on the run's nodes (--hosts/--exclude: only those), gathering
        their facts: a run's first plan needs their interfaces and GPUs. No setup module: each
        probe reports them, and they are merged into the inventory's fact cache (nodefacts). No
        network probe either: it would call the nodes at the addresses the facts about to be
        replaced gave (none on distrun_network before any were cached); run.yml's preflight probes
        the network at the addresses the plan made from the new facts uses."""
        names = [n.name for n in cluster.nodes]
        probed = nodefacts.Collector()
        result = self.run("preflight", "playbooks/preflight.yml", names, {**self.preflight_vars(), "preflight_net_probe": False},
                          limit=",".join(names), cached_facts=True, also=probed)
        sshmesh.remember(self.request.inventory, result.fact(sshmesh.FACT))
        nodefacts.merge(paths.fact_cache_dir(self.request.inventory), probed.facts)
        return result

    def refusal(self, result: PlaybookResult) -> UserError:
        """The one line that refuses a run its preflight failed."""
        return UserError(preflight_refusal(result, str(self.request.inventory)), exit_code=ExitCode.PREFLIGHT)
