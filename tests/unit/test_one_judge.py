"""One preflight judge: a fault is blamed on the same node, in the same words, by 'distrun check'
and by 'distrun train''s preflight.

Both paths start where the role ends: the verdict that role preflight computes through role
distrun's filter plugin and publishes as the fact preflight_verdict, and the nodes its judge
step fails. 'distrun check' turns that into its report (check.report_of); 'distrun train' into
its one-line refusal (check.preflight_refusal). The last test runs the role's judge step for real.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from distrun.preflight import check
from distrun.transport import ansible_bridge, handshake
from distrun.transport.playbook_events import HostProgress, PlaybookResult
from tests.harness.modules import load_file

from .conftest import REPO
from .test_check import NODES, SETUP
from .test_check import probe as full_probe

PLUGIN = REPO / "roles" / "distrun" / "filter_plugins" / "distrun_cluster.py"
OPTIONS = {"head": "node1", "shared_mode": "sync", "shared_dir": "/srv/distrun", "setup": SETUP,
           "seen": {}, "log_dir": "/runs/R1/ansible"}


def plugin():
    return load_file(PLUGIN, "distrun_cluster_under_test").FilterModule().filters()


def probe(host: str, **over) -> dict:
    """What the fast preflight probes on a node (no probe file in the shared folder)."""
    p = full_probe(host, **over)
    p.pop("shared_probe", None)
    p.pop("synced", None)
    if host != "node1":
        p.pop("ssh", None)  # only the head checks ssh in the fast set
    p["names"] = {"node1": p["names"]["node1"]}  # only the head's name
    return p


def versions(**over) -> dict:
    return {**full_probe("x")["versions"], **over}


# Fault kind -> (the probes of the three nodes, the check and the node it must be blamed on).
FAULTS: dict[str, tuple[dict[str, dict], str, str]] = {
    "never set up": ({"node2": {"setup": {"ok": False, "detail": "distrun never set up node2: no user distrun"}}},
                     "setup", "node2"),
    "env missing": ({"node3": {"env": {"ok": False, "detail": "/opt/env/bin/python is missing"},
                               "mpi4py": {"ok": False, "detail": "the env's Python did not run"}}}, "env", "node3"),
    "mpi4py broken": ({"node2": {"mpi4py": {"ok": False, "detail": "ImportError: libmpi.so.40"}}}, "mpi4py", "node2"),
    "a need missing": ({"node3": {"needs": {"torchrun": {"ok": False, "detail": "not in /opt/env/bin"}}}},
                       "needs", "node3"),
    "versions differ": ({"node3": {"versions": versions(torch="2.12.0")}}, "versions", "node3"),
    # The head is the odd one: the majority is the reference, on both paths.
    "the head's versions differ": ({"node1": {"versions": versions(mpi4py="0.0.1")}}, "versions", "node1"),
    "port busy": ({"node1": {"ports": {"29500": {"ok": False, "detail": "in use by python3 (pid 7)"}}}}, "ports", "node1"),
    "ssh refused": ({"node1": {"ssh": {"node2": {"ok": True, "detail": "ok"},
                                       "node3": {"ok": False, "detail": "Permission denied (publickey)"}}}},
                    "ssh", "node1"),
    "a name resolves elsewhere": ({"node3": {"names": {"node1": "10.99.99.99"}}}, "names", "node3"),
    "shared folder not writable": ({"node2": {"shared_writable": {"ok": False, "detail": "/srv/distrun is not writable"}}},
                                   "shared folder", "node2"),
    "shared folder not mounted": ({"node3": {"shared_mount": {"ok": False, "detail": "/srv/distrun is not mounted"}}},
                                  "shared folder", "node3"),
    "probe crashed": ({"node2": {"probe_error": {"step": "ports"}}}, "preflight", "node2"),
}


def role_run(probes: dict) -> PlaybookResult:
    """What the bridge records when role preflight judged these probes: the verdict published by
    the first host (run_once), and every node the verdict blames failed by the judge step."""
    filters = plugin()
    verdict = filters["distrun_preflight_report"](probes, **OPTIONS)
    hosts = {}
    for h in NODES:
        problems = filters["distrun_preflight_problems"](verdict, h)
        hosts[h] = HostProgress(h, ok=3, failed=int(bool(problems)), failed_step="preflight" if problems else "",
                                last_error=("Fail the node: " + " | ".join(problems)) if problems else "")
    hosts["node1"].facts[check.PREFLIGHT_FACT] = json.loads(json.dumps(verdict))
    return PlaybookResult("playbooks/run.yml", 2, "failed", hosts, Path("."))


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_check_and_train_blame_the_same_node_in_the_same_words(fault):
    over, kind, node = FAULTS[fault]
    probes = {h: probe(h, **over.get(h, {})) for h in NODES}
    result = role_run(probes)
    assert [h for h, st in result.hosts.items() if st.failed] == [node]  # the role fails only that node

    report = check.report_of(result, NODES)
    item = report[kind][node]
    blamed = {(c, h) for c, items in report.items() for h, it in items.items() if not it.ok}
    assert (kind, node) in blamed and {h for _, h in blamed} == {node}, blamed

    refusal = check.preflight_refusal(result, "test")
    assert refusal.startswith(f"preflight failed on {node}: ")
    assert f"{kind}: {item.detail} on {node}: {item.fix}" in refusal
    assert "nothing was started (see 'distrun check --inventory test')" in refusal


def test_a_node_that_did_not_answer_is_named_by_both(tmp_path):
    probes = {h: probe(h) for h in ("node1", "node2")}
    result = role_run(probes)
    result.hosts["node3"] = HostProgress("node3", unreachable=True, failed_step="preflight",
                                         last_error="Gather facts: ssh: connect to host node3: No route to host")
    report = check.report_of(result, NODES)
    assert not report["reach"]["node3"].ok and "No route to host" in report["reach"]["node3"].detail
    refusal = check.preflight_refusal(result, "test")
    assert refusal.startswith("preflight failed on node3: reach: ") and "No route to host" in refusal


JUDGE_PLAY = """\
- name: Judge the probes in the inventory as role preflight does
  hosts: head:workers
  gather_facts: false
  tasks:
    - name: Enter the preflight step
      ansible.builtin.set_fact:
        distrun_step: preflight
    - name: Run the preflight role's judge step
      ansible.builtin.include_role:
        name: preflight
        tasks_from: judge
        public: true
"""


def test_the_roles_judge_step_publishes_the_verdict_and_fails_the_node_it_blames(tmp_path, monkeypatch):
    """The role for real, on three local hosts whose probe results the inventory holds."""
    over, kind, node = FAULTS["the head's versions differ"]
    hosts = {}
    for h in NODES:
        stdout = json.dumps(probe(h, **over.get(h, {})))
        hosts[h] = {"_preflight_probe_run": {"stdout": stdout}}
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "preflight_inventory": "test", "preflight_log_dir": "/runs/R1/ansible"},
                         "children": {"head": {"hosts": {"node1": None}},
                                      "workers": {"hosts": hosts}}}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps(inventory))
    playbook = tmp_path / "judge.yml"
    playbook.write_text(JUDGE_PLAY)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    result = ansible_bridge.run_playbook(str(playbook), inv, tmp_path / "run")
    assert {h.name for h in result.failures()} == {node}
    assert result.hosts[node].failed_step == "preflight"
    published = result.fact(check.PREFLIGHT_FACT)
    assert published is not None and not published[kind][node]["ok"]
    detail = published[kind][node]["detail"]
    assert detail.startswith("versions differ: mpi4py 4.1.2 on node2,node3 but 0.0.1 on node1")
    assert detail in result.hosts[node].last_error  # the role's own message says the same
    assert handshake.failed_step(result) == "preflight"
    assert f"versions: {detail} on node1" in check.preflight_refusal(result, "test")
