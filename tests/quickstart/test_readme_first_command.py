"""The README's first command, verbatim, on a fresh Debian node as a new user would run it.

A container of the test-node image (Debian 12 with systemd, nothing of distrun on it) gets a
clone of this repository at /root/distrun; the test runs ``scripts/quickstart`` there as root
and reads what it printed, then asks the CLI the new user now has for its run records.

What the test gives the node besides the clone is caches only (a run with all of them warm
takes about 2 minutes here, one with none about 4, most of the difference Jittor's compile):

* this machine's pip configuration and the local wheel folders it names, read-only, as every
  machine of this project has them (torch 2.13.0's CPU wheel comes from there), and pip's
  cache, shared with the cluster tests' nodes;
* apt's downloaded packages, in a host folder kept per node image (apt still resolves and
  installs everything itself);
* Jittor's compiled core from the cluster tests' nodes (same image, so same compiler and
  Python), placed in ``/etc/skel`` under the path Jittor computes on a node named ``node1``:
  ``useradd`` copies it into the training user's home when ``distrun setup`` creates that user.
  Without a kept build (this test run alone on a cold machine) Jittor compiles on the node, as
  it would for the user.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.cluster import jittor_nodes
from tests.harness import podcluster

REPO = Path(__file__).resolve().parents[2]
CONTAINER = f"{os.environ.get('DISTRUN_CLUSTER_NAME', 'distrun-pytest')}-quickstart"
HOSTNAME = "node1"             # where the cluster tests' Jittor build was compiled
USER_HOME = "/home/distrun"    # role base's default home for inventory/local's training user
PIP_CONF = (Path("/etc/pip.conf"), Path("/etc/xdg/pip"))
SUCCEEDED = re.compile(r"^run (\S+-train-\S+) succeeded in [\d.]+s test_acc=([\d.]+)$", re.M)

# Last in its pytest run (scripts/test runs it beside the cluster tests): by then the cluster's
# nodes have compiled Jittor and kept the build this test gives the node.
pytestmark = pytest.mark.phase(2)


def _pip_binds() -> list[str]:
    """-v arguments for this machine's pip configuration and the local folders it names."""
    binds: list[str] = []
    folders: set[str] = set()
    for conf in PIP_CONF:
        if not conf.exists():
            continue
        binds += ["-v", f"{conf}:{conf}:ro"]
        for f in [conf] if conf.is_file() else sorted(conf.glob("*.conf")):
            parser = configparser.ConfigParser()
            parser.read(f)
            for section in parser.sections():
                for key in ("find-links", "extra-index-url", "index-url"):
                    for word in parser.get(section, key, fallback="").split():
                        folders.add(word.removeprefix("file://"))
    for folder in sorted(folders):
        path = Path(folder)
        # A file:// index points at .../simple; bind its parent so the index's relative links hold.
        top = path.parent if path.name == "simple" else path
        if folder.startswith("/") and top.is_dir():
            binds += ["-v", f"{top}:{top}:ro"]
    return binds


def _apt_archives(image: str) -> Path:
    """The host folder kept as apt's archive folder for nodes of ``image`` (others are removed)."""
    path = jittor_nodes.CACHE_ROOT / f"quickstart-apt-{image.rsplit(':', 1)[-1]}"
    (path / "partial").mkdir(parents=True, exist_ok=True)
    for old in jittor_nodes.CACHE_ROOT.glob("quickstart-apt-*"):
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return path


def _exec(cmd: str, timeout: float, input_bytes: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", "-i", "-w", "/root/distrun", CONTAINER, "bash", "-c", cmd],
                          input=input_bytes, capture_output=True, timeout=timeout, check=False)


def _seed_jittor(image: str) -> str:
    """Put the kept Jittor build where useradd copies it from; says what it did."""
    kept = jittor_nodes.kept_for_image(image)
    if kept is None:
        return "no Jittor build kept for this image: Jittor compiles on the node"
    tar, built_at = kept
    prefix = f"{USER_HOME}/.cache/jittor/"
    if not built_at.startswith(prefix):
        return f"the kept Jittor build was made at {built_at}, not under {prefix}: Jittor compiles on the node"
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert names and all(n == "jittor" or n.startswith("jittor/") for n in names), f"{tar}: not a ~/.cache/jittor tar"
    done = _exec("install -d /etc/skel/.cache && tar -x -C /etc/skel/.cache", 600, tar.read_bytes())
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return f"Jittor build from {tar.name} placed in /etc/skel"


class _FreshNode:
    """The container in the shape jittor_nodes reads a cluster in (node 1 is the container)."""

    def __init__(self, image: str) -> None:
        self.image = image

    def node(self, k: int) -> podcluster.Node:
        return podcluster.Node(index=k, name=HOSTNAME, container=CONTAINER, ip="")

    def exec(self, k: int, cmd: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", "exec", CONTAINER, "sh", "-c", cmd], capture_output=True, text=True,
                              check=check, timeout=timeout)


@pytest.fixture(scope="module")
def fresh_node(tmp_path_factory):
    podcluster.ensure_podman()
    image = podcluster.build_image().ref
    subprocess.run(["podman", "rm", "-f", "-t", "0", CONTAINER], capture_output=True, check=False)
    clone = tmp_path_factory.mktemp("clone") / "distrun"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    args = ["podman", "run", "-d", "--name", CONTAINER, "--hostname", HOSTNAME, "--systemd=always",
            # A machine's root may make mount namespaces: each run's unit gets its own /tmp and
            # /dev/shm that way (launch.py), which podman's default capabilities refuse.
            "--cap-add", "NET_RAW", "--cap-add", "SYS_ADMIN",
            "-v", f"{podcluster.node_pip_cache()}:/root/.cache/pip",
            "-v", f"{_apt_archives(image)}:/var/cache/apt/archives",
            *_pip_binds()]
    started = subprocess.run([*args, image], capture_output=True, text=True, timeout=120, check=False)
    if started.returncode != 0:
        pytest.fail(f"podman could not start {CONTAINER} from {image}: {started.stderr.strip()}", pytrace=False)
    try:
        subprocess.run(["podman", "cp", str(clone), f"{CONTAINER}:/root/distrun"], check=True, timeout=300)
        yield image, _seed_jittor(image)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", CONTAINER], capture_output=True, check=False)


@pytest.fixture(scope="module")
def quickstart(fresh_node) -> tuple[subprocess.CompletedProcess, str]:
    # Verbatim: the README's command, from the clone's root, as root.
    image, seeded = fresh_node
    proc = _exec("scripts/quickstart", timeout=2700)
    if proc.returncode == 0:
        # The node's build (Jittor's core, its MPI extension, the GCN's kernels) is kept for the
        # next session under the key the cluster tests use, when it holds more than the kept one.
        jittor_nodes.keep_richer(_FreshNode(image))
    return proc, seeded


def _output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")


def test_readme_first_command_trains_the_reference_gcn_with_two_ranks(quickstart):
    proc, seeded = quickstart
    out = _output(proc)
    assert proc.returncode == 0, f"scripts/quickstart exit {proc.returncode} ({seeded}):\n{out[-6000:]}"
    m = SUCCEEDED.search(out)
    assert m, f"no 'run ... succeeded ... test_acc=' line in its output:\n{out[-4000:]}"
    assert float(m[2]) >= 0.8, f"test accuracy {m[2]} on the generated graph (it learns to about 1.0)"
    result = re.search(r"^DISTRUN_RESULT (\{.*\})$", out, re.M)
    assert result, f"no DISTRUN_RESULT line in its output:\n{out[-3000:]}"
    fields = json.loads(result[1])
    assert (fields["workload"], fields["ranks"]) == ("gcn_jittor", 2), fields
    assert "per-rank logs: 2 of 2 collected" in out, out[-3000:]
    # What the quickstart printed last: `distrun runs`, the setup and the training run, both succeeded.
    header = re.search(r"^run\s+verb\s+status\s", out, re.M)
    assert header, f"no `distrun runs` table at the end:\n{out[-3000:]}"
    table = out[header.start():]
    assert re.search(r"-setup-\S*\s+setup\s+succeeded\s+0\s", table), table
    assert re.search(rf"{re.escape(m[1])}\s+train\s+succeeded\s+0\s", table), table


def test_the_new_users_cli_lists_the_run_for_scripts(quickstart):
    proc, _ = quickstart
    assert proc.returncode == 0, "scripts/quickstart failed (see the test above)"
    runs = _exec(".venv/bin/distrun runs --json", 60)
    assert runs.returncode == 0, _output(runs)
    records = json.loads(runs.stdout)["runs"]
    by_verb = {r["verb"]: r for r in records}
    assert set(by_verb) == {"setup", "train"}, records
    assert by_verb["train"]["status"] == "succeeded" and by_verb["train"]["rc"] == 0, by_verb["train"]
    assert by_verb["setup"]["status"] == "succeeded", by_verb["setup"]

