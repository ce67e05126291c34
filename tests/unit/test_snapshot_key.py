"""The test cluster's snapshot is reused only for the same converge: its key changes with every
file the first `distrun setup` depends on (committed or not), and with nothing else."""

from __future__ import annotations

import subprocess

from tests.harness import podcluster


def _repo(tmp_path):
    for rel, text in {"roles/base/tasks/main.yml": "- name: a\n", "runner/distrun/cli/main.py": "x = 1\n",
                      "inventory/test/group_vars/all.yml": "a: 1\n", "docs/guide.md": "# guide\n",
                      ".gitignore": "inventory/test/hosts.yml\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    return tmp_path


def test_the_key_follows_the_converges_inputs_and_nothing_else(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setattr(podcluster, "REPO_ROOT", repo)
    monkeypatch.setattr(podcluster, "DEFAULT_INVENTORY", repo / "inventory" / "test" / "hosts.yml")
    key = podcluster.snapshot_key("localhost/distrun-node:aaaa", 3)
    assert key == podcluster.snapshot_key("localhost/distrun-node:aaaa", 3)
    # What the harness writes and what the converge never reads: the same key.
    (repo / "inventory" / "test" / "hosts.yml").write_text("all: {}\n")
    (repo / "docs" / "guide.md").write_text("# another guide\n")
    assert podcluster.snapshot_key("localhost/distrun-node:aaaa", 3) == key
    # Another node image, another size, an edited role, a new (uncommitted) role file: new keys.
    assert podcluster.snapshot_key("localhost/distrun-node:bbbb", 3) != key
    assert podcluster.snapshot_key("localhost/distrun-node:aaaa", 2) != key
    (repo / "roles" / "base" / "tasks" / "main.yml").write_text("- name: b\n")
    edited = podcluster.snapshot_key("localhost/distrun-node:aaaa", 3)
    assert edited != key
    (repo / "roles" / "base" / "tasks" / "extra.yml").write_text("- name: c\n")
    assert podcluster.snapshot_key("localhost/distrun-node:aaaa", 3) not in (key, edited)
