"""The head's ssh check before a run: a full login only when something a login depends on changed
since one was proved, otherwise sshd's banner; a broken mesh still refuses the run.

The mode, the judge, the kept baseline and the runner's retry, on fake probes through the role's
filters (the probe's own side is in test_probe_ssh.py); the role's judge step runs for real.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from distrun.errors import UserError
from distrun.inventory.cluster import cluster_from_json
from distrun.planning.attempt import plan_attempt
from distrun.preflight import sshmesh
from distrun.preflight.judge import verdict
from distrun.preflight.report import refusal
from distrun.run import launching, playbooks, starter, train
from distrun.run.attempt import End
from distrun.run.listener import Listener
from distrun.store.runs import Phases, new_run
from distrun.transport.playbook_events import HostProgress, PlaybookEvent, PlaybookResult

from .plans import request_for
from .test_check import NODES, SETUP
from .test_check import probe as full_probe
from .test_one_judge import JUDGE_PLAY as ONE_JUDGE_PLAY
from .test_one_judge import OPTIONS, plugin, probe

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


# The runner: run.yml with banners, again with logins when a node changed, the baseline kept after.

def judged_hosts(filters: dict, found: dict, mesh: dict) -> dict[str, HostProgress]:
    """Each node as the playbook leaves it after role preflight's judge: failed where the verdict
    blames it, and the head publishing the verdict and the ssh summary."""
    hosts = {}
    for h in NODES:
        problems = filters["distrun_preflight_problems"](found, h)
        hosts[h] = HostProgress(h, ok=3, failed=int(bool(problems)), failed_step="preflight" if problems else "",
                                last_error=" | ".join(problems))
    hosts["node1"].facts = {"preflight_verdict": found, sshmesh.FACT: mesh}
    return hosts


class FakeRole:
    """run.yml as the runner sees it: role preflight's judge on probes whose ssh results follow
    the mode the baseline given makes the role pick; staging always passes."""

    def __init__(self, fingerprints: dict[str, str], login: dict | None = None, banner: dict | None = None) -> None:
        self.fingerprints, self.login, self.banner = fingerprints, login or {}, banner or {}
        self.baselines: list[dict] = []
        self.filters = plugin()

    def __call__(self, playbook: str, inventory: Path, run_dir: Path, extravars: dict, **_: object) -> PlaybookResult:
        baseline = extravars["preflight_ssh_baseline"]
        self.baselines.append(baseline)
        how = self.filters["distrun_ssh_mode"](baseline, "node1", ["node2", "node3"])
        probes = {h: probe(h, ssh_fingerprint=self.fingerprints[h]) for h in NODES}
        ok = {"ok": True, "check": how, "detail": "sshd answers" if how == "banner" else "ssh in batch mode works"}
        probes["node1"]["ssh"] = {t: {**ok, **(self.banner if how == "banner" else self.login).get(t, {})}
                                  for t in ("node2", "node3")}
        found = self.filters["distrun_preflight_report"](probes, **OPTIONS, ssh_baseline=baseline)
        hosts = judged_hosts(self.filters, found, self.filters["distrun_ssh_mesh"](probes, head="node1", baseline=baseline))
        failed = any(h.failed for h in hosts.values())
        on_event = _.get("on_event")
        if callable(on_event) and not failed:  # each probe staged the run, then each node passed the judge
            for h in NODES:
                said = {**probes[h], "staged": extravars["distrun_run_id"]}
                on_event(PlaybookEvent("ok", h, "probe", data={"stdout": json.dumps(said)}))
            for h in NODES:
                on_event(PlaybookEvent("ok", h, "judge", data={"ansible_facts": {"preflight_verdict": found}}))
        return PlaybookResult(playbook, 2 if failed else 0, "failed" if failed else "successful", hosts, run_dir)


def launch(tmp_path: Path, monkeypatch, role: FakeRole) -> int | None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    hosts = {h: {"ansible_connection": "local", "ansible_host": f"10.0.0.{i}", "slots": 1} for i, h in enumerate(NODES, 1)}
    cluster = cluster_from_json(inv, {"_meta": {"hostvars": hosts}, "all": {"children": ["head", "workers"]},
                                      "head": {"hosts": ["node1"]}, "workers": {"hosts": NODES}}, None)
    monkeypatch.setattr(playbooks, "run_playbook", role)
    monkeypatch.setattr(starter, "launch", lambda cluster, plan, hosts: {})
    monkeypatch.setattr(launching.certificate, "issue", lambda cluster, plan: {})  # no CA here: no head of a cluster
    request = request_for(inv, launcher="torchrun", workload="ddp", np=3)
    run = train.Run(request, Listener(), Phases(new_run("train", inv)), cluster)
    end = run.launch(plan_attempt(request, cluster, run.record.id))
    return None if end == End.LAUNCHED else int(run.current.attempt.exit_code) if run.current else 1


def test_a_run_with_nothing_changed_checks_banners_once(tmp_path, monkeypatch):
    sshmesh.remember(tmp_path / "hosts.yml", login_mesh(FP))
    role = FakeRole(FP)
    assert launch(tmp_path, monkeypatch, role) is None
    assert role.baselines == [FP]


def test_a_changed_node_makes_the_run_log_in_again_and_keep_what_it_proved(tmp_path, monkeypatch):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, login_mesh(FP))
    now = {**FP, "node3": "sha256:new"}
    role = FakeRole(now)
    assert launch(tmp_path, monkeypatch, role) is None  # launched
    assert role.baselines == [FP, {}]  # banners, then logins
    assert sshmesh.baseline(inv, "node1") == now


def test_a_changed_node_whose_login_fails_refuses_the_run_with_the_ssh_error(tmp_path, monkeypatch):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, login_mesh(FP))
    role = FakeRole({**FP, "node3": "sha256:new"},
                    login={"node3": {"ok": False, "detail": "distrun@node3: Permission denied (publickey)."}})
    with pytest.raises(UserError) as refused:
        launch(tmp_path, monkeypatch, role)
    assert refused.value.exit_code == 3
    assert (f"ssh: node1 -> node3: distrun@node3: Permission denied (publickey). on node1: {SSH_FIX}"
            in str(refused.value))
    assert role.baselines == [FP, {}]
    assert sshmesh.baseline(inv, "node1") == {}  # the next run logs in too


def test_an_sshd_that_does_not_answer_refuses_at_once(tmp_path, monkeypatch):
    sshmesh.remember(tmp_path / "hosts.yml", login_mesh(FP))
    role = FakeRole(FP, banner={"node2": {"ok": False, "detail": "sshd does not answer on 10.0.0.12:22: Connection refused"}})
    with pytest.raises(UserError) as refused:
        launch(tmp_path, monkeypatch, role)
    assert "ssh: node1 -> node2: sshd does not answer on 10.0.0.12:22: Connection refused on node1" in str(refused.value)
    assert role.baselines == [FP]  # no second try: a login would not get further


def test_a_first_run_logs_in_and_the_next_one_checks_banners(tmp_path, monkeypatch):
    role = FakeRole(FP)
    assert launch(tmp_path, monkeypatch, role) is None
    assert launch(tmp_path, monkeypatch, role) is None
    assert role.baselines == [{}, FP]


# test_one_judge's play (the role's judge step, its variables public), and one task more.
JUDGE_PLAY = ONE_JUDGE_PLAY + """\
    - name: Publish how the head's probe would check ssh
      ansible.builtin.set_fact:
        seen_ssh_mode: "{{ _preflight_ssh_mode }}"
      when: inventory_hostname == preflight_head
"""


def test_the_roles_judge_step_publishes_the_fingerprints_and_fails_the_unverified_head(tmp_path, monkeypatch):
    """The role for real, on three local hosts whose probe results the inventory holds: node3's
    fingerprint changed since the baseline the runner passes."""
    from distrun.transport import ansible_bridge

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


# 'distrun check': every node checks every other, the mesh the last logins proved is kept.

def mesh_probes(fingerprints: dict[str, str], baseline: dict[str, str], broken: dict | None = None) -> dict[str, dict]:
    """The full set's probes as the role makes them: each node logs in to the others, or checks
    their banners where the mode the baseline gives it says so; ``broken``: (src, dst) -> result."""
    modes = plugin()["distrun_ssh_mode"]
    probes = {}
    for h in NODES:
        others = [o for o in NODES if o != h]
        how = modes(baseline, h, others)
        ssh = {o: {"ok": True, "check": how, "detail": "sshd answers" if how == "banner" else "ssh in batch mode works"}
               for o in others}
        ssh.update({dst: {"check": how, **r} for (src, dst), r in (broken or {}).items() if src == h})
        probes[h] = full_probe(h, ssh=ssh, ssh_fingerprint=fingerprints[h])
    return probes


def test_a_check_whose_logins_all_passed_proves_the_mesh_and_the_next_checks_banners(tmp_path):
    inv = tmp_path / "hosts.yml"
    mesh = sshmesh.summary(mesh_probes(FP, {}), head="node1", baseline={}, every=True)
    assert mesh == {"head": "node1", "checked": "login", "passed": True, "fingerprints": FP, "unverified": [],
                    "mesh": True}
    sshmesh.remember(inv, mesh)
    assert sshmesh.mesh_baseline(inv) == FP and sshmesh.baseline(inv, "node1") == FP
    probes = mesh_probes(FP, FP)
    assert {r["check"] for p in probes.values() for r in p["ssh"].values()} == {"banner"}
    ssh = verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP, ssh_baseline=FP)["ssh"]
    assert ssh["node2"].ok and ssh["node2"].detail == "sshd answers on node1,node3 (login verified earlier, nothing changed since)"
    again = sshmesh.summary(probes, head="node1", baseline=FP, every=True)
    assert again["checked"] == "banner" and not sshmesh.unverified(again)
    sshmesh.remember(inv, again)  # banners prove nothing new, and lose nothing
    assert sshmesh.mesh_baseline(inv) == FP


def test_a_node_that_changed_leaves_every_node_checking_it_unverified():
    now = {**FP, "node3": "sha256:new"}
    probes = mesh_probes(now, FP)
    ssh = verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP, ssh_baseline=FP)["ssh"]
    assert {h for h, it in ssh.items() if not it.ok} == {"node1", "node2", "node3"}
    assert "no login was verified since node3 changed" in ssh["node2"].detail
    assert sshmesh.summary(probes, head="node1", baseline=FP, every=True)["unverified"] == ["node3"]


def test_a_failed_login_anywhere_in_the_mesh_forgets_every_proof(tmp_path):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, sshmesh.summary(mesh_probes(FP, {}), head="node1", baseline={}, every=True))
    failed = mesh_probes(FP, {}, broken={("node2", "node3"): {"ok": False, "detail": "Permission denied (publickey)."}})
    mesh = sshmesh.summary(failed, head="node1", baseline={}, every=True)
    assert mesh["checked"] == "login" and not mesh["passed"]
    sshmesh.remember(inv, mesh)
    assert sshmesh.mesh_baseline(inv) == {} and sshmesh.baseline(inv, "node1") == {}


def test_a_mesh_with_a_node_whose_probe_broke_is_not_proved(tmp_path):
    probes = mesh_probes(FP, {})
    probes["node3"] = {"host": "node3", "probe_error": {"step": "ssh"}}
    mesh = sshmesh.summary(probes, head="node1", baseline={}, every=True)
    assert not mesh["passed"]


def test_a_runs_head_logins_keep_the_mesh_a_check_proved(tmp_path):
    inv = tmp_path / "hosts.yml"
    sshmesh.remember(inv, sshmesh.summary(mesh_probes(FP, {}), head="node1", baseline={}, every=True))
    sshmesh.remember(inv, login_mesh({"node1": FP["node1"], "node2": FP["node2"]}))
    assert sshmesh.mesh_baseline(inv) == FP


class FakeCheck:
    """preflight.yml's full set as 'distrun check' sees it: the role's modes and judge on the
    probes of nodes whose fingerprints are ``fingerprints``; ``broken`` logins fail."""

    def __init__(self, fingerprints: dict[str, str], broken: dict | None = None) -> None:
        self.fingerprints, self.broken = fingerprints, broken or {}
        self.baselines: list[dict] = []
        self.filters = plugin()

    def __call__(self, playbook: str, inventory: Path, run_dir: Path, extravars: dict, **_: object) -> PlaybookResult:
        baseline = extravars["preflight_ssh_baseline"]
        self.baselines.append(baseline)
        probes = mesh_probes(self.fingerprints, baseline, None if baseline else self.broken)
        found = self.filters["distrun_preflight_report"](
            probes, **{**OPTIONS, "seen": {"node2": "/srv/distrun/.p", "node3": "/srv/distrun/.p"}}, ssh_baseline=baseline)
        hosts = judged_hosts(self.filters, found,
                             self.filters["distrun_ssh_mesh"](probes, head="node1", baseline=baseline, every=True))
        failed = any(h.failed for h in hosts.values())
        return PlaybookResult(playbook, 2 if failed else 0, "failed" if failed else "successful", hosts, run_dir)


def check_run(tmp_path: Path, monkeypatch, role: FakeCheck, ssh_logins: bool = False) -> dict:
    from distrun.preflight import check

    inv = tmp_path / "hosts.ini"
    inv.write_text("[head]\nnode1 ansible_host=10.0.0.1\n[workers]\nnode2 ansible_host=10.0.0.2\n"
                   "node3 ansible_host=10.0.0.3\n")
    monkeypatch.setattr(check, "run_playbook", role)
    report, _ = check.run_check(inv, "test", ssh_logins=ssh_logins)
    return report


def test_check_logs_in_first_then_checks_banners_and_logs_in_again_after_a_change(tmp_path, monkeypatch):
    role = FakeCheck(FP)
    first = check_run(tmp_path, monkeypatch, role)
    second = check_run(tmp_path, monkeypatch, role)
    assert first["ok"] and second["ok"]
    assert first["checks"]["ssh"]["node2"]["detail"] == "reaches node1,node3"
    assert second["checks"]["ssh"]["node2"]["detail"].startswith("sshd answers on node1,node3")
    role.fingerprints = {**FP, "node2": "sha256:new"}  # e.g. its user's keys were rewritten
    third = check_run(tmp_path, monkeypatch, role)
    assert third["ok"] and third["checks"]["ssh"]["node2"]["detail"] == "reaches node1,node3"
    assert role.baselines == [{}, FP, FP, {}]
    assert sshmesh.mesh_baseline(tmp_path / "hosts.ini") == role.fingerprints


def test_a_changed_node_whose_login_fails_is_named_by_check_with_the_ssh_fix(tmp_path, monkeypatch):
    check_run(tmp_path, monkeypatch, FakeCheck(FP))
    role = FakeCheck({**FP, "node3": "sha256:new"},
                     broken={("node2", "node3"): {"ok": False, "detail": "distrun@node3: Permission denied (publickey)."}})
    report = check_run(tmp_path, monkeypatch, role)
    assert role.baselines == [FP, {}] and not report["ok"]
    bad = {h for h, it in report["checks"]["ssh"].items() if not it["ok"]}
    assert bad == {"node2"}
    assert report["checks"]["ssh"]["node2"]["detail"] == "node2 -> node3: distrun@node3: Permission denied (publickey)."
    assert report["checks"]["ssh"]["node2"]["fix"] == SSH_FIX
    assert sshmesh.mesh_baseline(tmp_path / "hosts.ini") == {}


def test_check_ssh_logins_logs_in_whatever_was_proved(tmp_path, monkeypatch):
    role = FakeCheck(FP)
    check_run(tmp_path, monkeypatch, role)
    check_run(tmp_path, monkeypatch, role, ssh_logins=True)
    assert role.baselines == [{}, {}]


def test_the_roles_full_set_has_every_node_check_banners_once_the_mesh_holds_them_all(tmp_path, monkeypatch):
    """The role's mode variable for real: in the full set, every node (not only the head)."""
    from distrun.transport import ansible_bridge

    playbook = tmp_path / "modes.yml"
    playbook.write_text(ONE_JUDGE_PLAY + """\
    - name: Publish how each node's probe would check ssh
      ansible.builtin.set_fact:
        seen_ssh_mode: "{{ _preflight_ssh_mode }}"
""")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    for baseline, want in [(FP, "banner"), ({"node1": FP["node1"], "node2": FP["node2"]}, "login")]:
        probes = mesh_probes(FP, baseline)
        hosts = {h: {"_preflight_probe_run": {"stdout": json.dumps(p)}, "_preflight_seen": {"exists": True, "path": "/srv/distrun/.p"}}
                 for h, p in probes.items()}
        inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                      "preflight_inventory": "test", "preflight_log_dir": "/runs/R1/ansible"},
                             "children": {"head": {"hosts": {"node1": None}}, "workers": {"hosts": hosts}}}}
        inv = tmp_path / f"hosts-{want}.yml"
        inv.write_text(json.dumps(inventory))
        result = ansible_bridge.run_playbook(str(playbook), inv, tmp_path / f"run-{want}",
                                             extravars={"preflight_ssh_baseline": baseline, "preflight_full": True})
        modes = {h: (result.hosts[h].facts or {}).get("seen_ssh_mode") for h in NODES}
        assert result.ok and modes == {h: want for h in NODES}, [h.last_error for h in result.failures()]


class Progress:
    """The live table 'distrun check' prints (ui.console.PlaybookProgress), recording what it is told."""

    def __init__(self, names: list[str]) -> None:
        from distrun.ui.console import PlaybookProgress

        self.table = PlaybookProgress("check", names)
        self.said: list[str] = []

    def __enter__(self) -> Progress:
        self.table.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.table.__exit__(*exc)

    def __call__(self, ev: PlaybookEvent) -> None:
        self.table(ev)

    def again(self, why: str) -> None:
        self.said.append(why)
        self.table.again(why)


def test_the_live_table_starts_again_with_the_logins_and_says_why(tmp_path, monkeypatch, capsys):
    from distrun.preflight import check

    check_run(tmp_path, monkeypatch, FakeCheck(FP))
    seen: list[Progress] = []

    def progress(names: list[str]) -> Progress:
        seen.append(Progress(names))
        return seen[-1]

    role = FakeCheck({**FP, "node3": "sha256:new"})
    inv = tmp_path / "hosts.ini"
    monkeypatch.setattr(check, "run_playbook", lambda *a, on_event=None, **k: (
        on_event(PlaybookEvent("failed", "node1", "judge", message="unverified")), role(*a, **k))[1])
    report, _ = check.run_check(inv, "test", progress=progress)
    assert report["ok"] and role.baselines == [FP, {}]
    assert seen[0].said == ["ssh: node3 changed since the logins between the nodes were proved: "
                            "every node logs in to every other again"]
    assert "every node logs in to every other again" in capsys.readouterr().out
    # The second run's table starts from nothing: only its own event is counted.
    assert seen[0].table.hosts["node1"].failed == 1 and seen[0].table.hosts["node2"].failed == 0
