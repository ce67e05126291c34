"""'distrun check' runs every node's probe at once: its full network probe's listeners wait for a
call from every other node, and a node started only when a fork frees up (after the first nodes
gave up waiting for it) was reported as refused by every node before it, and the reverse."""

from __future__ import annotations

import pytest

from distrun.preflight import check


class _Stop(Exception):
    pass


@pytest.mark.parametrize("workers", [3, 25])
def test_check_asks_for_one_fork_per_node(tmp_path, monkeypatch, workers):
    inv = tmp_path / "hosts.ini"
    inv.write_text("[head]\nw1\n[workers]\n" + "".join(f"w{k} ansible_host=192.0.2.{k}\n" for k in range(1, workers + 1)))
    asked: dict = {}

    def playbook(name, inventory, run_dir, **kwargs):
        asked.update(kwargs, name=name)
        raise _Stop

    monkeypatch.setattr(check, "run_playbook", playbook)
    with pytest.raises(_Stop):
        check.run_check(inv, str(inv))
    assert asked["name"] == "playbooks/preflight.yml" and asked["forks"] == workers


def test_check_asks_every_node_for_the_inventorys_image(tmp_path, monkeypatch):
    inv = tmp_path / "hosts.ini"
    asked: dict = {}

    def playbook(name, inventory, run_dir, **kwargs):
        asked.update(kwargs["extravars"])
        raise _Stop

    monkeypatch.setattr(check, "run_playbook", playbook)
    for text, want in [("", None), ("[all:vars]\ndistrun_image=localhost/train:1\ndistrun_container_runtime=docker\n",
                                   {"ref": "localhost/train:1", "runtime": "docker", "modules": []})]:  # looked inside too
        inv.write_text("[head]\nw1 ansible_host=192.0.2.1\n[workers]\nw1\n" + text)
        asked.clear()
        with pytest.raises(_Stop):
            check.run_check(inv, str(inv))
        assert asked.get("preflight_image") == want
