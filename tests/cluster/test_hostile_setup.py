"""A training job plants links in the paths setup writes; the next 'distrun setup' must refuse
them (one clear line naming node and path) and leave every root-owned target as it was.

The job is a real one, submitted with 'distrun train --script': every user of a shared cluster
can run one, and it runs as the training user. Two rounds, because a node stops at its first
refusal and a later planted link on the same node would go untried.
"""

from __future__ import annotations

import json
import shlex

from .conftest import distrun
from .hostile import TALLY

HOME = "/home/distrun"
SHARED = "/srv/distrun"

# node, link the job plants, root-owned target it points to, what setup must say. Round 1 keeps
# the ssh mesh whole (the head's sync to the other nodes runs before the hostfile is rendered);
# round 2 breaks it on purpose, where every refusal comes from the same task.
ROUND_1 = [
    (3, f"{HOME}/.bashrc", "/etc/sudoers.d/distrun-victim", "remove the link ~distrun/.bashrc on node3"),
    (1, f"{SHARED}/hostfile", "/etc/distrun-victim-hostfile", f"remove the link {SHARED}/hostfile on node1"),
]
ROUND_2 = [
    (2, f"{HOME}/.ssh", "/usr/local/lib/distrun-victim", f"remove the link {HOME}/.ssh on node2"),
    (1, f"{HOME}/.ssh/id_ed25519", "/etc/distrun-victim-secret", f"remove the link {HOME}/.ssh/id_ed25519 on node1"),
    (3, f"{HOME}/.ssh/authorized_keys", "/etc/distrun-victim-keys",
     f"remove the link {HOME}/.ssh/authorized_keys on node3"),
]

# Each rank with LOCAL_RANK 0 plants its node's links: moves the real file aside, links its path.
JOB = """\
import json, os, shutil, socket, sys
if os.environ.get("LOCAL_RANK", "0") == "0":
    for link, target in json.loads(sys.argv[1]).get(socket.gethostname().split(".")[0], []):
        if os.path.lexists(link) and not os.path.islink(link):
            shutil.move(link, link + ".orig")  # as mv: a copy where the file system cannot rename
        os.symlink(target, link)
        print("planted", link, "->", target, flush=True)
"""


def make_targets(cluster, attacks) -> None:
    for k, _, target, _ in attacks:
        if target == "/usr/local/lib/distrun-victim":
            cluster.exec(k, f"mkdir -p {target} && echo keep > {target}/file && chmod 0755 {target} && chown -R root:root {target}")
        else:
            cluster.exec(k, f"echo '# distrun test victim' > {target} && chown root:root {target} && chmod 0440 {target}")


def fingerprint(cluster, k: int, target: str) -> str:
    """Owner, mode and content of a target (a folder: of it and everything in it)."""
    cmd = (f"find {shlex.quote(target)} -xdev -printf '%p %u:%g %m %y\\n' | sort; "
           f"find {shlex.quote(target)} -xdev -type f -exec sha256sum {{}} + | sort")
    return cluster.exec(k, cmd).stdout


def plant(cluster, tmp_path, attacks) -> None:
    plan: dict[str, list[list[str]]] = {}
    for k, link, target, _ in attacks:
        plan.setdefault(f"node{k}", []).append([link, target])
    script = tmp_path / "plant.py"
    script.write_text(JOB)
    res = distrun("train", "--inventory", "test", "--script", str(script), "--", json.dumps(plan), timeout=600)
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
    for k, link, target, _ in attacks:
        assert cluster.exec(k, f"readlink {link}").stdout.strip() == target, f"the job did not plant {link} on node{k}"


def clean(cluster, attacks) -> None:
    # Root removes the links themselves (rm never follows one), then puts the real files back.
    for k in (1, 2, 3):
        for _, link, target, _ in attacks:
            cluster.exec(k, f"if [ -L {link} ]; then rm -f {link}; fi; "
                            f"if [ -e {link}.orig ] && [ ! -e {link} ]; then mv {link}.orig {link}; fi", check=False)
    for k, _, target, _ in attacks:
        cluster.exec(k, f"rm -rf {target}", check=False)


def attack_round(cluster, tmp_path, attacks) -> int:
    """Plant, run setup, and return how many targets changed (0 when every attack failed)."""
    make_targets(cluster, attacks)
    before = {(k, t): fingerprint(cluster, k, t) for k, _, t, _ in attacks}
    plant(cluster, tmp_path, attacks)
    res = distrun("setup", "--inventory", "test", timeout=900)
    out = res.stdout + res.stderr
    assert res.rc != 0, "setup succeeded over planted links:\n" + res.stdout[-4000:]
    assert "Traceback" not in out
    lines = out.splitlines()
    for k, link, target, said in attacks:
        hits = [ln for ln in lines if said in ln]
        assert hits, f"no refusal naming node{k} and {link}:\n{res.stdout[-5000:]}"
        # One line: the node, the path, where it points, and the fix.
        assert any(f"(it points to {target}) and run distrun setup again" in ln for ln in hits), hits
    succeeded = 0
    for k, link, target, _ in attacks:
        succeeded += TALLY.record(f"setup writes through a link at {link} on node{k}",
                                  fingerprint(cluster, k, target) != before[(k, target)])
    # The secret the job pointed the key host's key at reached no node.
    # (A planted link itself still points at the secret: only a real key file counts.)
    key = f"{HOME}/.ssh/id_ed25519"
    secret_leaked = any("distrun test victim" in cluster.exec(k, f"[ -L {key} ] || cat {key} 2>/dev/null || true",
                                                               check=False).stdout for k in (1, 2, 3))
    return succeeded + TALLY.record("the key host's key pointed at a root secret reaches the nodes", secret_leaked)


def test_links_planted_by_a_job_are_refused_and_no_root_path_changes(provisioned, tmp_path):
    tried = succeeded = 0
    try:
        for attacks in (ROUND_1, ROUND_2):
            try:
                succeeded += attack_round(provisioned, tmp_path, attacks)
                tried += len(attacks)
            finally:
                clean(provisioned, attacks)
    finally:
        print(f"hostile setup: attacks tried {tried}, succeeded {succeeded}", flush=True)
    assert tried == len(ROUND_1) + len(ROUND_2)
    assert succeeded == 0
    # Links gone: setup passes again and has nothing to change, for the rest of the suite. This is
    # the suite's second converge of the shared cluster: setup.yml is idempotent (changed=0).
    again = distrun("setup", "--inventory", "test", timeout=900)
    assert again.rc == 0, again.stdout[-4000:]
    assert again.recap()["changed"] == 0, again.stdout[-6000:]
