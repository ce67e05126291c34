"""'distrun check' takes the facts later plans read from its own probes (no fact gathering): the
probe's part that reads them, the runner's allow-list and its merge into the controller's cache,
read back as a plan reads it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from distrun.inventory import rules
from distrun.inventory.cluster import load_facts
from distrun.planning.network import ifaces_from_facts
from distrun.preflight import nodefacts
from distrun.transport.playbook_events import PlaybookEvent

PART = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "probe_facts.py"


def probe_facts() -> dict:
    ns: dict = {"__name__": "probe", "subprocess": subprocess}
    exec(compile(PART.read_text(), str(PART), "exec"), ns)  # noqa: S102 - the shipped part
    return ns["probe_facts"]()


@pytest.mark.skipif(not shutil.which("ip"), reason="the probe reads the interfaces with iproute2's ip, not here")
def test_the_probe_reports_this_machines_interfaces_and_the_cache_names_them_as_the_setup_module():
    said = probe_facts()
    assert isinstance(said["local"], dict) and said["python"]["executable"]
    facts = nodefacts.cache_facts(json.loads(json.dumps(said)))  # as it travels
    assert "lo" in facts["ansible_interfaces"]
    assert facts["ansible_lo"]["ipv4"]["address"] == "127.0.0.1" and facts["ansible_lo"]["ipv4"]["netmask"] == "255.0.0.0"
    assert "127.0.0.1" not in facts["ansible_all_ipv4_addresses"]  # as setup's: loopback left out
    default = rules.default_ipv4(facts)
    assert not default or default in facts["ansible_all_ipv4_addresses"]


def _answer(host: str, facts: dict) -> PlaybookEvent:
    return PlaybookEvent("ok", host, "Probe", data={"stdout": "noise\n" + json.dumps({"host": host, "facts": facts})})


def test_the_cache_keeps_only_the_facts_a_plan_reads_from_a_probes_answer_and_what_setup_cached_beside(tmp_path):
    cached = {"ansible_interfaces": ["eth0", "lo"], "ansible_eth0": {"ipv4": {"address": "10.0.0.5", "netmask": "255.255.255.0"}},
              "ansible_distribution": "Debian", "ansible_default_ipv4": {"address": "10.0.0.5"}}
    said = {"interfaces": [{"name": "ib0", "active": True, "planted": "x",
                            "ipv4": [{"address": "10.9.0.7", "netmask": "255.255.0.0", "network": "10.9.0.0", "prefix": "16"},
                                     {"address": "10.9.1.7", "netmask": "255.255.255.0"}]},
                           {"name": "lo", "ipv4": [{"address": "127.0.0.1", "netmask": "255.0.0.0"}]}, {"name": 5}],
            "default_route": {"interface": "ib0", "gateway": "10.9.0.1"},
            "local": {"gpus": 4, "mpi_prefix": "/opt/ompi"}, "python": {"executable": "/usr/bin/python3"},
            "ansible_env": {"PATH": "/tmp/evil"}, "distrun_step": "stage"}
    collected = nodefacts.Collector()
    collected(_answer("n1", said))
    collected(PlaybookEvent("ok", "n2", "Other", data={"stdout": "{}"}))
    assert set(collected.facts) == {"n1"}
    (tmp_path / "s1_n1").write_text(json.dumps({"__payload__": json.dumps(cached)}))
    nodefacts.merge(tmp_path, collected.facts)
    facts = load_facts(tmp_path, "n1")
    assert facts is not None
    assert "ansible_env" not in facts and "distrun_step" not in facts and "planted" not in facts["ansible_ib0"]
    assert "ansible_eth0" not in facts and facts["ansible_distribution"] == "Debian"  # eth0 gone; setup's other facts kept
    assert [(i.name, i.address, i.network) for i in ifaces_from_facts(facts)] == [
        ("ib0", "10.9.0.7", "10.9.0.0/16"), ("ib0", "10.9.1.7", "10.9.1.0/24"), ("lo", "127.0.0.1", "127.0.0.0/8")]
    assert rules.default_ipv4(facts) == "10.9.0.7" and rules.gpus(facts) == 4
    assert facts["ansible_all_ipv4_addresses"] == ["10.9.0.7", "10.9.1.7"]
    assert oct((tmp_path / "s1_n1").stat().st_mode & 0o777) == "0o600"
    nodefacts.merge(tmp_path, {"n3": nodefacts.cache_facts(said)})  # a node no fact was cached for yet
    assert rules.default_ipv4(load_facts(tmp_path, "n3")) == "10.9.0.7"


class FactsCheck:
    """preflight.yml as 'distrun check' sees it: every node's probe answers with ``said`` (its facts
    on distrun_network 10.9.0.0/16), and the play passes; each run's extra-vars are kept."""

    def __init__(self, said: dict[str, str]) -> None:
        self.said: dict[str, str] = said
        self.asked: list[dict] = []

    def __call__(self, playbook: str, inventory: Path, run_dir: Path, extravars: dict, on_event=None, **kw: object):
        from distrun.transport.playbook_events import HostProgress, PlaybookResult

        self.asked.append({**extravars, "cached_facts": kw.get("cached_facts")})
        for host, address in self.said.items():
            on_event(_answer(host, {"interfaces": [{"name": "ib0", "active": True, "ipv4": [
                {"address": address, "netmask": "255.255.0.0", "network": "10.9.0.0", "prefix": "16"}]}],
                "default_route": {"interface": "ib0", "gateway": "10.9.0.1"}, "local": {}, "python": {}}))
        return PlaybookResult(playbook, 0, "successful", {h: HostProgress(h) for h in self.said}, run_dir)


def _fast_check(tmp_path: Path, monkeypatch, role: FactsCheck) -> list[dict]:
    from distrun import paths
    from distrun.preflight import check

    inv = tmp_path / "hosts.ini"
    inv.write_text("[head]\nn1 ansible_host=10.0.0.1\n[workers]\nn2 ansible_host=10.0.0.2\n"
                   "[all:vars]\ndistrun_network=10.9.0.0/16\n")
    monkeypatch.setattr(check, "run_playbook", role)
    monkeypatch.setattr(check, "settle_drains", lambda *a, **k: {})
    role.asked.clear()
    check.run_check(inv, "test")
    cluster = check.cluster_from_json(inv, check.inventory_read.read_inventory_json(inv), paths.fact_cache_dir(inv))
    assert nodefacts.probe_addresses(cluster, paths.fact_cache_dir(inv)) == role.said
    return role.asked


def test_check_probes_the_network_at_the_addresses_the_nodes_report_not_at_none_or_stale_cached_ones(
        tmp_path, monkeypatch):
    role = FactsCheck({"n1": "10.9.0.1", "n2": "10.9.0.2"})
    # No facts cached yet (a new inventory): the plays see none, so a first pass collects them
    # without the network probe, and the second probes the network at them.
    first = _fast_check(tmp_path, monkeypatch, role)
    assert [a.get("preflight_net_probe", True) for a in first] == [False, True]
    assert all(a["cached_facts"] for a in first)
    # Nothing changed: one pass, the plays reading the cache.
    assert [a.get("preflight_net_probe", True) for a in _fast_check(tmp_path, monkeypatch, role)] == [True]
    # n2 moved on that network since: probed again at its new address.
    role.said = {"n1": "10.9.0.1", "n2": "10.9.3.2"}
    assert [a.get("preflight_net_probe", True) for a in _fast_check(tmp_path, monkeypatch, role)] == [True, True]
