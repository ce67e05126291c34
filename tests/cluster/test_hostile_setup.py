"""A training job plants links in the paths setup writes, or a wheel where setup's pip looks; the
next 'distrun setup' must refuse them (one clear line naming node and path) and leave every
root-owned target as it was, installing nothing.

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

# node, link the job plants, root-owned target it points to, what setup must say: every path
# setup still writes as the training user (roles ssh_mesh: ~/.ssh and its known_hosts; mpi_env:
# ~/.bashrc's block; hostfile: the hostfile on the shared folder). Round 1 keeps the ssh mesh whole
# (the head's sync to the other nodes runs before the hostfile is rendered); round 2 breaks it on
# purpose, where every refusal comes from the same task.
ROUND_1 = [
    (3, f"{HOME}/.bashrc", "/etc/sudoers.d/distrun-victim", "remove the link ~distrun/.bashrc on node3"),
    (1, f"{SHARED}/hostfile", "/etc/distrun-victim-hostfile", f"remove the link {SHARED}/hostfile on node1"),
]
ROUND_2 = [
    (2, f"{HOME}/.ssh", "/usr/local/lib/distrun-victim", f"remove the link {HOME}/.ssh on node2"),
    (1, f"{HOME}/.ssh/known_hosts", "/etc/distrun-victim-secret", f"remove the link {HOME}/.ssh/known_hosts on node1"),
    (3, f"{HOME}/.ssh/known_hosts", "/etc/distrun-victim-keys",
     f"remove the link {HOME}/.ssh/known_hosts on node3"),
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
    # The roles that write these paths (the full setup runs them the same way, after base's and
    # people's steps, which write none of them); the full converge comes after both rounds.
    res = distrun("setup", "--inventory", "test", "--tags", "ssh_mesh,mpi_env,hostfile", timeout=900)
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
    # No root file the job pointed a link at was read into a file of the training user's: setup
    # copied no target's text to a path it writes (known_hosts is read before it is rewritten).
    # (A planted link itself still points at its target: only a real file counts.)
    paths = sorted({link for _, link, _, _ in attacks})
    leaked = [f"{link} on node{k}" for k in (1, 2, 3) for link in paths
              if "distrun test victim" in cluster.exec(k, f"[ -L {link} ] || cat {link} 2>/dev/null || true",
                                                         check=False).stdout]
    return succeeded + TALLY.record("a root file a job linked reaches a file setup writes as the training user",
                                    bool(leaked))


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


# A job fills a wheelhouse on the shared folder (the training user's) with a wheel of a package the
# admin is about to add. Its .pth file runs in every Python that starts with that env, and setup's
# root starts it right after pip. Setup must refuse the wheelhouse before pip runs.
WHEELS = f"{SHARED}/wheels"
PROBE = "/var/tmp/distrun-wheel-probe-root"
WHEEL_JOB = f"""\
import os, zipfile
if os.environ.get("LOCAL_RANK", "0") == "0":
    os.makedirs({WHEELS!r}, exist_ok=True)
    pth = "import os; os.getuid() == 0 and open({PROBE!r}, 'w').write('root ran the job wheel')\\n"
    files = {{"distrun_wheel_probe.pth": pth,
             "distrun_wheel_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: distrun-wheel-probe\\nVersion: 1.0\\n",
             "distrun_wheel_probe-1.0.dist-info/WHEEL":
                 "Wheel-Version: 1.0\\nGenerator: job\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}}
    record = "".join(f"{{name}},,\\n" for name in files) + "distrun_wheel_probe-1.0.dist-info/RECORD,,\\n"
    with zipfile.ZipFile({WHEELS!r} + "/distrun_wheel_probe-1.0-py3-none-any.whl", "w") as whl:
        for name, text in {{**files, "distrun_wheel_probe-1.0.dist-info/RECORD": record}}.items():
            whl.writestr(name, text)
    print("planted a wheel in", {WHEELS!r}, flush=True)
"""


def test_a_wheelhouse_a_job_can_write_is_refused_before_pip_runs(provisioned, tmp_path):
    import yaml

    from tests.harness import matrix

    from .conftest import REPO

    group_vars = REPO / "inventory" / "test" / "group_vars"
    packages = yaml.safe_load((group_vars / "all.yml").read_text())["mpi_env_packages"] + ["distrun-wheel-probe"]
    inventory = matrix.mode_inventory(provisioned.inventory, group_vars, tmp_path / "inventory", None,
                                      mpi_env_wheelhouse=WHEELS, mpi_env_packages=packages)
    script = tmp_path / "wheel.py"
    script.write_text(WHEEL_JOB)
    try:
        res = distrun("train", "--inventory", "test", "--script", str(script), timeout=600)
        assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
        setup = distrun("setup", "--inventory", str(inventory), "--tags", "mpi_env", timeout=900)
        out = setup.stdout + setup.stderr
        assert setup.rc != 0, "setup installed from the job's wheelhouse:\n" + setup.stdout[-4000:]
        assert "Traceback" not in out
        for k in (1, 2, 3):
            said = (f"mpi_env_wheelhouse {WHEELS} on node{k} can be changed by others than root: "
                    f"{SHARED} is owned by distrun")
            assert any(said in line and line.rstrip().endswith("and run distrun setup again")
                       for line in out.splitlines()), f"no refusal naming node{k}:\n{setup.stdout[-5000:]}"
        ran = [k for k in (1, 2, 3) if provisioned.exec(k, f"test -e {PROBE}", check=False).returncode == 0
               or provisioned.exec(k, "/opt/distrun/venv/bin/pip show -q distrun-wheel-probe", check=False).returncode == 0]
        assert not TALLY.record("setup's root pip installs a wheel a job put in a wheelhouse on the shared folder",
                                bool(ran)), f"the job's wheel was installed on nodes {ran}"
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"rm -rf {WHEELS} {PROBE}; /opt/distrun/venv/bin/pip uninstall -y -q distrun-wheel-probe "
                                ">/dev/null 2>&1; true", check=False)
