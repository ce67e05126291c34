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
def test_the_probe_reports_this_machines_interfaces_as_the_setup_module_names_them():
    facts = probe_facts()
    assert "lo" in facts["ansible_interfaces"]
    assert facts["ansible_lo"]["ipv4"]["address"] == "127.0.0.1" and facts["ansible_lo"]["ipv4"]["netmask"] == "255.0.0.0"
    assert "127.0.0.1" not in facts["ansible_all_ipv4_addresses"]  # as setup's: loopback left out
    assert isinstance(facts["ansible_local"]["distrun"], dict) and facts["ansible_python"]["executable"]
    default = facts["ansible_default_ipv4"]
    assert not default or default["address"] in facts["ansible_all_ipv4_addresses"]


def _answer(host: str, facts: dict) -> PlaybookEvent:
    return PlaybookEvent("ok", host, "Probe", data={"stdout": "noise\n" + json.dumps({"host": host, "facts": facts})})


def test_the_cache_keeps_only_the_allowed_facts_of_a_probes_answer_and_what_setup_cached_beside(tmp_path):
    cache_dir_facts = {"ansible_interfaces": ["eth0", "lo"], "ansible_eth0": {"ipv4": {"address": "10.0.0.5", "netmask": "255.255.255.0"}},
                       "ansible_distribution": "Debian", "ansible_default_ipv4": {"address": "10.0.0.5"}}
    said = {"ansible_interfaces": ["ib0", "lo"],
            "ansible_ib0": {"device": "ib0", "ipv4": {"address": "10.9.0.7", "netmask": "255.255.0.0"}, "ipv4_secondaries": [],
                            "planted": "x"},
            "ansible_lo": {"ipv4": {"address": "127.0.0.1", "netmask": "255.0.0.0"}},
            "ansible_default_ipv4": {"address": "10.9.0.7", "interface": "ib0"},
            "ansible_all_ipv4_addresses": ["10.9.0.7"], "ansible_local": {"distrun": {"gpus": 4, "mpi_prefix": "/opt/ompi"}},
            "ansible_python": {"executable": "/usr/bin/python3"}, "ansible_env": {"PATH": "/tmp/evil"}, "distrun_step": "stage"}
    collected = nodefacts.Collector()
    collected(_answer("n1", said))
    collected(PlaybookEvent("ok", "n2", "Other", data={"stdout": "{}"}))
    assert set(collected.facts) == {"n1"}
    return_cache = tmp_path
    (return_cache / "s1_n1").write_text(json.dumps({"__payload__": json.dumps(cache_dir_facts)}))
    nodefacts.merge(return_cache, collected.facts)
    facts = load_facts(return_cache, "n1")
    assert facts is not None
    assert "ansible_env" not in facts and "distrun_step" not in facts and "planted" not in facts["ansible_ib0"]
    assert "ansible_eth0" not in facts and facts["ansible_distribution"] == "Debian"  # eth0 gone; setup's other facts kept
    assert [(i.name, i.address, i.network) for i in ifaces_from_facts(facts)] == [("ib0", "10.9.0.7", "10.9.0.0/16"),
                                                                                 ("lo", "127.0.0.1", "127.0.0.0/8")]
    assert rules.default_ipv4(facts) == "10.9.0.7" and rules.gpus(facts) == 4
    assert oct((return_cache / "s1_n1").stat().st_mode & 0o777) == "0o600"
    nodefacts.merge(return_cache, {"n3": nodefacts.allowed(said)})  # a node no fact was cached for yet
    assert rules.default_ipv4(load_facts(return_cache, "n3")) == "10.9.0.7"
