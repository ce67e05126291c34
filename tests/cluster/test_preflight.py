"""The fast preflight of 'distrun train' on the 3-node cluster: what this run needs, and the head's
name, checked on every node before anything starts; refused with the words 'distrun check' uses,
and nothing of the refused run left on any node (a first attempt is staged in the probe's round
trip, and removed again when the run is refused).

Each test breaks one cheap thing on one node and restores it in ``finally``.
"""

from __future__ import annotations

import json

from .conftest import distrun

TORCHRUN = "/opt/distrun/venv/bin/torchrun"


def run_dirs(cluster) -> dict[int, set[str]]:
    return {k: set(cluster.exec(k, "ls -1 /srv/distrun/runs 2>/dev/null || true").stdout.split()) for k in (1, 2, 3)}


def refusal(result) -> str:
    return " ".join(result.stderr.split())


def test_torchrun_missing_on_one_node_is_refused_and_leaves_nothing_staged(provisioned, tmp_path, distrun_home):
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    before = run_dirs(provisioned)
    provisioned.exec(2, f"mv {TORCHRUN} {TORCHRUN}.off")
    try:
        train = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script), timeout=300)
        err = refusal(train)
        assert train.rc == 3, train.stdout[-2000:] + train.stderr
        assert (f"needs: torchrun is not in /opt/distrun/venv/bin on node2: add torch to the env's packages "
                "(mpi_env_packages) and run 'distrun setup --inventory ") in err, err
        assert "preflight failed on node2:" in err and "nothing was started" in err
        assert "Traceback" not in train.stdout + train.stderr
        assert run_dirs(provisioned) == before  # nothing of the run left on any node
        # The record says where the attempt stopped, and why: refused after the judge, never staged.
        record = max((distrun_home / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
        states = json.loads((record / "attempts" / "0" / "states.json").read_text())
        reached = [s["state"] for s in states["states"]]
        assert states["end"] == "refused" and "judged" in reached and "staged" not in reached, states
        assert "needs: torchrun is not in /opt/distrun/venv/bin on node2" in states["why"], states
    finally:
        provisioned.exec(2, f"mv {TORCHRUN}.off {TORCHRUN}")


def test_a_node_resolving_the_heads_name_wrongly_is_refused_with_checks_words(provisioned, tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    before = run_dirs(provisioned)
    # The first /etc/hosts line for a name wins; the file is bind-mounted: rewrite it in place.
    provisioned.exec(3, "cp /etc/hosts /tmp/hosts.bak && { echo '10.99.99.99 node1'; cat /tmp/hosts.bak; } > /etc/hosts")
    try:
        train = distrun("train", "--inventory", "test", "--script", str(script), timeout=300)
        err = refusal(train)
        assert train.rc == 3, train.stdout[-2000:] + train.stderr
        assert "preflight failed on node3:" in err, err
        check = distrun("check", "--inventory", "test", "--json", timeout=300)
        item = json.loads(check.stdout)["checks"]["names"]["node3"]
        assert not item["ok"]
        said = [part for part in item["detail"].split("; ") if part.startswith("node3 resolves node1 to 10.99.99.99")]
        assert said, item
        # train says what check says, with the same fix
        # (check names the inventory as typed, train by its path)
        assert f"names: {said[0]}" in err and item["fix"].split("(role base")[0] in err, (err, item)
        assert run_dirs(provisioned) == before
    finally:
        provisioned.exec(3, "cat /tmp/hosts.bak > /etc/hosts")


def test_a_node_distrun_never_set_up_is_named_with_distrun_setup_by_check_and_train(provisioned, tmp_path):
    """A node without the training user (as on a machine 'distrun setup' never reached): one
    line naming the node and 'distrun setup', from check and from train, and no Python text."""
    script = tmp_path / "noop.py"
    script.write_text("print('should not run')\n")
    before = run_dirs(provisioned)
    # The account disappears from the user database; its files and processes stay as they are.
    provisioned.exec(3, "cp /etc/passwd /tmp/passwd.bak && sed -i 's/^distrun:/distrun-gone:/' /etc/passwd")
    try:
        check = distrun("check", "--inventory", "test", "--json", timeout=300)
        assert check.rc != 0, check.stdout[-2000:]
        item = json.loads(check.stdout)["checks"]["setup"]["node3"]
        assert item == {"ok": False, "detail": "distrun never set up node3: no user distrun",
                        "fix": "run 'distrun setup --inventory test'"}, item
        train = distrun("train", "--inventory", "test", "--script", str(script), timeout=300)
        err = refusal(train)
        assert train.rc == 3, train.stdout[-2000:] + train.stderr
        assert "preflight failed on node3: setup: distrun never set up node3: no user distrun on node3: " \
               "run 'distrun setup --inventory " in err, err
        assert train.stderr.strip().count("\n") == 0, train.stderr
        assert "Traceback" not in train.stdout + train.stderr and "KeyError" not in train.stdout + train.stderr
        assert run_dirs(provisioned) == before
    finally:
        provisioned.exec(3, "cat /tmp/passwd.bak > /etc/passwd")
