"""The runner's half of run.yml's handshake (distrun.transport.handshake) held against the playbook and the
roles it runs: every gate, fact and tag the runner names is where the runner expects it, and the
playbook names no fact or tag the runner does not know."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from distrun.transport import handshake as hs

REPO = Path(__file__).resolve().parents[2]


def tasks(path: str) -> list[dict[str, Any]]:
    """A playbook's plays' tasks, or a task file's tasks."""
    out: list[dict[str, Any]] = []
    for item in yaml.safe_load((REPO / path).read_text()):
        out += item.get("tasks", []) if "hosts" in item else [item]
    return out


def set_facts(path: str) -> dict[str, dict[str, Any]]:
    """Fact name -> the task that sets it."""
    return {k: t for t in tasks(path) for k in (t.get("ansible.builtin.set_fact") or {})}


def test_the_facts_the_runner_reads_are_the_ones_the_playbook_and_judge_publish():
    run = set_facts("playbooks/run.yml")
    assert set(run) == {hs.STEP_FACT, hs.STAGED_FACT}, "run.yml publishes a fact the runner does not read"
    assert run[hs.STEP_FACT]["ansible.builtin.set_fact"][hs.STEP_FACT] == hs.STEPS[1]
    assert run[hs.STAGED_FACT]["ansible.builtin.set_fact"][hs.STAGED_FACT] is True
    assert hs.PREFLIGHT_FACT in set_facts("roles/preflight/tasks/judge.yml")


def test_the_tags_the_runner_skips_are_on_the_tasks_it_means():
    run = tasks("playbooks/run.yml")
    tagged = {tag: t for t in run for tag in t.get("tags", [])}
    assert set(tagged) == {hs.GATE_TAG, hs.STAGE_STEPS_TAG}, "run.yml tags a task the runner does not know"
    assert hs.STEP_FACT in tagged[hs.GATE_TAG]["ansible.builtin.set_fact"]
    assert hs.STAGED_FACT in tagged[hs.STAGE_STEPS_TAG]["ansible.builtin.set_fact"]
    stage = {tag for t in tasks("roles/job/tasks/stage.yml") for tag in t.get("tags", [])}
    assert {hs.UNPACK_TAG, hs.STAGE_STEPS_TAG} <= stage
    roles = "\n".join(p.read_text() for p in REPO.glob("roles/*/tasks/*.yml"))
    for tag in set(hs.RUN_SKIPS) - {"always"}:  # 'always' is Ansible's own
        assert re.search(rf"tags: \[[^\]]*\b{tag}\b", roles), f"no task is tagged {tag}"


def test_the_gates_and_switches_reach_the_playbook_by_the_names_the_runner_sets():
    text = (REPO / "playbooks/run.yml").read_text()
    assert f"lookup('distrun_gate', {hs.CLAIM_GATE_VAR})" in text
    assert f"{hs.STAGE_EARLY_VAR} | default(false)" in text
    defaults = yaml.safe_load((REPO / "roles/job/defaults/main.yml").read_text())
    assert defaults["job_upload_gate"] == f"{{{{ {hs.UPLOAD_GATE_VAR} | default('') }}}}"
    assert hs.upload_gate(1, 2) == "upload-1-2" and hs.CLAIM_GATE == "claim"


def test_every_raw_command_is_one_line_of_shell():
    """A raw task's folded command runs in the node's shell as written: a line break kept by YAML
    (a more-indented continuation line) would split it into two commands, the second of them the
    probe's JSON configuration."""
    raws = []
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/*.yml")]):
        for task in tasks(str(path.relative_to(REPO))):
            for block in [task, *task.get("block", [])]:
                if "ansible.builtin.raw" in block:
                    raws.append((path.name, block["ansible.builtin.raw"]))
    assert {name for name, _ in raws} >= {"stage.yml", "stop.yml"}
    assert [(name, cmd.count("\n")) for name, cmd in raws if "\n" in cmd] == []
