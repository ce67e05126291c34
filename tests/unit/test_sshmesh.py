"""The head's ssh check before a run: a full login only when something a login depends on changed
since one was proved, otherwise sshd's banner; a broken mesh still refuses the run.

The mode, the judge and the kept baseline, on fake probes through the role's
filters (the probe's own side is in test_probe_ssh.py); the role's judge step runs for real.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from distrun import sshmesh
from distrun.judge import refusal, verdict

from .test_check import NODES, SETUP
from .test_one_judge import plugin, probe

FP = {"node1": "sha256:aa", "node2": "sha256:bb", "node3": "sha256:cc"}
SSH_FIX = f"run '{SETUP} --tags ssh_mesh' (add base if names do not resolve)"


# The mode, the judge and the published summary.

def test_the_head_checks_banners_only_when_the_baseline_holds_it_and_every_target():
    assert sshmesh.mode(FP, "node1", ["node2", "node3"]) == "banner"
    assert sshmesh.mode({"node1": "a", "node2": "b"}, "node1", ["node2", "node3"]) == "login"  # node3 never proved
    assert sshmesh.mode({"node2": "b", "node3": "c"}, "node1", ["node2", "node3"]) == "login"  # from another head
    assert sshmesh.mode({}, "node1", ["node2"]) == "login"
    assert plugin()["distrun_ssh_mode"](FP, "node1", ["node2", "node3"]) == "banner"


def banner_probes(fingerprints: dict[str, str], **results: dict) -> dict[str, dict]:
    probes = {h: probe(h, ssh_fingerprint=fingerprints[h]) for h in NODES}
    probes["node1"]["ssh"] = {t: {"ok": True, "check": "banner", "detail": "sshd answers"} for t in ("node2", "node3")}
    probes["node1"]["ssh"].update(results)
    return probes


def judged(probes: dict, baseline: dict) -> dict:
    return verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP, ssh_baseline=baseline)


def test_banners_with_every_fingerprint_as_kept_pass_and_say_the_login_was_verified_earlier():
    ssh = judged(banner_probes(FP), FP)["ssh"]["node1"]
    assert ssh.ok and ssh.detail == "sshd answers on node2,node3 (login verified earlier, nothing changed since)"


@pytest.mark.parametrize("changed", ["node1", "node3"])
def test_a_changed_node_leaves_the_login_unverified_and_the_run_logs_in_again(changed):
    now = {**FP, changed: "sha256:new"}
    report = judged(banner_probes(now), FP)
    ssh = report["ssh"]["node1"]
    assert not ssh.ok
    assert ssh.detail == (f"node1 -> node2,node3: sshd answers, but no login was verified since {changed} changed "
                          "(the user, its ssh keys or config, sshd or a reboot)")
    mesh = sshmesh.summary(banner_probes(now), head="node1", baseline=FP)
    assert sshmesh.unverified(mesh) and mesh["unverified"] == [changed] and mesh["checked"] == "banner"


def test_an_sshd_that_does_not_answer_refuses_the_run_with_the_ssh_fix():
    probes = banner_probes(FP, node3={"ok": False, "check": "banner",
                                      "detail": "sshd does not answer on 10.0.0.13:22: Connection refused"})
    report = judged(probes, FP)
    assert refusal(report) == ("ssh: node1 -> node3: sshd does not answer on 10.0.0.13:22: Connection refused on node1: "
                               + SSH_FIX)
    assert not sshmesh.unverified(sshmesh.summary(probes, head="node1", baseline=FP))


def test_logins_are_judged_as_before():
    probes = {h: probe(h, ssh_fingerprint=FP[h]) for h in NODES}
    assert judged(probes, {})["ssh"]["node1"].detail == "reaches node2,node3"
    mesh = sshmesh.summary(probes, head="node1", baseline={})
    assert mesh == {"head": "node1", "checked": "login", "passed": True, "fingerprints": FP, "unverified": []}


# The baseline kept per inventory.

def login_mesh(fingerprints: dict[str, str], passed: bool = True, head: str = "node1") -> dict:
    return {"head": head, "checked": "login", "passed": passed, "fingerprints": fingerprints, "unverified": []}


def test_passing_logins_are_kept_privately_per_inventory_and_for_their_head_only(tmp_path):
    a, b = tmp_path / "a" / "hosts.yml", tmp_path / "b" / "hosts.yml"
    sshmesh.remember(a, login_mesh(FP))
    assert sshmesh.baseline(a, "node1") == FP
    assert sshmesh.baseline(b, "node1") == {}  # another cluster's node1
    assert sshmesh.baseline(a, "node2") == {}  # never proved from node2
    kept = [p for p in sshmesh._file(a).parent.iterdir() if p.name.endswith(".ssh-mesh.json")]
    assert len(kept) == 1 and kept[0].stat().st_mode & 0o777 == 0o600
    assert not [p for p in kept[0].parent.iterdir() if p.name.endswith(".tmp")]  # written whole, then renamed


def test_banner_checks_keep_nothing_and_a_failed_login_forgets_everything(tmp_path):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, {**login_mesh({**FP, "node3": "sha256:new"}), "checked": "banner"})
    assert sshmesh.baseline(inv, "node1") == {}
    sshmesh.remember(inv, login_mesh(FP))
    sshmesh.remember(inv, {**login_mesh({}), "checked": "none"})  # no targets: nothing learned, nothing lost
    assert sshmesh.baseline(inv, "node1") == FP
    sshmesh.remember(inv, login_mesh(FP, passed=False))
    assert sshmesh.baseline(inv, "node1") == {}


def test_logins_to_some_nodes_add_to_the_kept_ones_unless_the_head_changed(tmp_path):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, login_mesh(FP))
    sshmesh.remember(inv, login_mesh({"node1": FP["node1"], "node2": "sha256:b2"}))  # a run on node2 only
    assert sshmesh.baseline(inv, "node1") == {**FP, "node2": "sha256:b2"}
    sshmesh.remember(inv, login_mesh({"node1": "sha256:a2", "node2": "sha256:b2"}))
    # node3 was proved from the head as it was: not from the head as it is now.
    assert sshmesh.baseline(inv, "node1") == {"node1": "sha256:a2", "node2": "sha256:b2"}


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
    - name: Publish how the head's probe would check ssh
      ansible.builtin.set_fact:
        seen_ssh_mode: "{{ _preflight_ssh_mode }}"
      when: inventory_hostname == preflight_head
"""


def test_the_roles_judge_step_publishes_the_fingerprints_and_fails_the_unverified_head(tmp_path, monkeypatch):
    """The role for real, on three local hosts whose probe results the inventory holds: node3's
    fingerprint changed since the baseline the runner passes."""
    from distrun import ansible_bridge

    probes = banner_probes({**FP, "node3": "sha256:new"})
    hosts = {h: {"_preflight_probe_run": {"stdout": json.dumps(p)}} for h, p in probes.items()}
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "preflight_inventory": "test", "preflight_log_dir": "/runs/R1/ansible"},
                         "children": {"head": {"hosts": {"node1": None}}, "workers": {"hosts": hosts}}}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps(inventory))
    playbook = tmp_path / "judge.yml"
    playbook.write_text(JUDGE_PLAY)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    result = ansible_bridge.run_playbook(str(playbook), inv, tmp_path / "run", extravars={"preflight_ssh_baseline": FP})
    assert {h.name for h in result.failures()} == {"node1"}
    assert "no login was verified since node3 changed" in result.hosts["node1"].last_error
    mesh = result.fact(sshmesh.FACT)
    assert mesh["fingerprints"] == {**FP, "node3": "sha256:new"} and sshmesh.unverified(mesh)

    result = ansible_bridge.run_playbook(str(playbook), inv, tmp_path / "run2",
                                         extravars={"preflight_ssh_baseline": {**FP, "node3": "sha256:new"}})
    assert result.ok and result.fact("seen_ssh_mode") == "banner"
    assert not sshmesh.unverified(result.fact(sshmesh.FACT))
