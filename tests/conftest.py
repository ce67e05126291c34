"""Shared pytest setup: the repo root on sys.path and the podman test-cluster fixtures.

Cluster fixtures (any test that uses them is marked ``cluster`` automatically):

* ``cluster3`` — session-scoped 3-node cluster (node1 = head, node1..3 = workers), inventory
  written to ``inventory/test/hosts.yml`` so ``inventory/test/group_vars`` apply to it.
* ``cluster_factory(n, name=None, wheelhouse=..., volumes=())`` — more clusters of any size; each
  gets its own inventory file under pytest's tmp dir; all are torn down at session end.

``DISTRUN_SKIP_CLUSTER=1`` skips them (quick local unit runs only). Where podman cannot run
containers they FAIL with the reason: a CI machine without a working podman is broken, and
a silent skip would report a green run that tested nothing.
``DISTRUN_CLUSTER_NAME`` names ``cluster3`` (default ``distrun-pytest``) and prefixes every other
cluster, so two sessions on one machine do not tear down each other's clusters: up() first
removes leftovers of its name.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def make_repo_importable() -> Path:
    """Put the repo root first on sys.path so ``tests.harness`` and the in-tree ``runner``
    sources import without installing anything; returns the repo root."""
    for path in (REPO_ROOT, REPO_ROOT / "runner"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return REPO_ROOT


make_repo_importable()

from tests.harness import podcluster  # noqa: E402  (needs the sys.path entry above)
from tests.harness.matrix import SITE_MOUNT  # noqa: E402
from tests.harness.suite_report import layer_table  # noqa: E402

CLUSTER_FIXTURES = {"cluster3", "cluster_factory"}
HOST_WHEELHOUSE = Path("/opt/wheels")
ClusterFactory = Callable[..., podcluster.Cluster]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marking by fixture use, not by folder, keeps `-m "not cluster"` right wherever a
    # cluster test lives.
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    # Tests that disrupt the shared cluster, or read what the whole session left behind, say so
    # with ``phase(n)`` and run after every test of a lower phase; file order holds otherwise.
    items.sort(key=phase_of)


def phase_of(item: pytest.Item) -> int:
    marker = item.get_closest_marker("phase")
    return int(marker.args[0]) if marker else 0


def session_cluster_name() -> str:
    return os.environ.get("DISTRUN_CLUSTER_NAME", "distrun-pytest")


def _require_podman() -> None:
    if os.environ.get("DISTRUN_SKIP_CLUSTER") == "1":
        pytest.skip("cluster tests disabled by DISTRUN_SKIP_CLUSTER")
    try:
        podcluster.ensure_podman()
    except podcluster.HarnessError as exc:
        pytest.fail(f"podman cannot run the test cluster on this machine: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    _require_podman()
    created: list[podcluster.Cluster] = []

    def make(n: int, name: str | None = None, wheelhouse: Path | None | str = "default",
             inventory: Path | None = None, volumes=(), node_images=()) -> podcluster.Cluster:
        """``name`` is a suffix of the session's cluster name (DISTRUN_CLUSTER_NAME), so two
        sessions on one machine never share a cluster; "" is that name itself."""
        suffix = f"f{len(created) + 1}" if name is None else name
        name = f"{session_cluster_name()}-{suffix}" if suffix else session_cluster_name()
        if wheelhouse == "default":
            wheelhouse = HOST_WHEELHOUSE if HOST_WHEELHOUSE.is_dir() else None
        inv = inventory or tmp_path_factory.mktemp(name) / "hosts.yml"
        try:
            cluster = podcluster.up(n, name=name, wheelhouse=wheelhouse, inventory=inv, volumes=volumes,
                                    node_images=node_images)
        except podcluster.HarnessError as exc:
            pytest.fail(f"test cluster {name!r} did not come up: {exc}", pytrace=False)
        created.append(cluster)
        return cluster

    yield make
    errors = []
    for cluster in created:
        try:
            cluster.down()
        except podcluster.HarnessError as exc:
            errors.append(str(exc))
    if errors:
        pytest.fail("tearing down test clusters failed: " + "; ".join(errors), pytrace=False)


@dataclass
class Provisioning:
    """Where cluster3 starts from: the node image, or the snapshot of an earlier first converge
    of the same inputs (podcluster.snapshot_key); ``key`` names the snapshot either way."""
    key: str
    node_images: list[str]

    @property
    def from_snapshot(self) -> bool:
        return bool(self.node_images)


@pytest.fixture(scope="session")
def cluster3_provisioning() -> Provisioning:
    _require_podman()
    try:
        base = podcluster.build_image().ref
    except podcluster.HarnessError as exc:
        pytest.fail(f"the node image could not be built: {exc}", pytrace=False)
    key = podcluster.snapshot_key(base, 3)
    # DISTRUN_TEST_SNAPSHOT=0: always converge fresh nodes (and keep no snapshot).
    use = os.environ.get("DISTRUN_TEST_SNAPSHOT", "1") != "0"
    return Provisioning(key=key if use else "", node_images=podcluster.snapshot_images(key, 3) if use else [])


@pytest.fixture(scope="session")
def cluster3(cluster_factory: ClusterFactory, tmp_path_factory: pytest.TempPathFactory,
             cluster3_provisioning: Provisioning) -> podcluster.Cluster:
    # One host folder bound into every node stands for a site's shared filesystem
    # (distrun_shared_fs_mode: external, tests/cluster/test_matrix.py). Traversable by every
    # user, as a site's filesystem is: pytest makes its folders 0700.
    site = tmp_path_factory.mktemp("site-shared")
    site.chmod(0o755)
    return cluster_factory(3, name="", inventory=podcluster.DEFAULT_INVENTORY,
                           volumes=[(site, SITE_MOUNT, "rw")], node_images=cluster3_provisioning.node_images)


# ---------------------------------------------------------------- the suite's layers, timed
LAYERS = ("unit", "docs/lint", "workloads", "molecule", "quickstart", "cluster")
_layer_reports: dict[str, list] = {}


# The suite's own Python is 3.11; a run on another (scripts/test runs the unit tests on a newer
# one too) gets its own rows.
PYTHON_TAG = "" if sys.version_info[:2] == (3, 11) else f" (py{sys.version_info[0]}.{sys.version_info[1]})"


def layer_of(nodeid: str) -> str:
    return _layer_of(nodeid) + PYTHON_TAG


def _layer_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in ("tests/test_ansible_lint.py", "tests/test_python_lint.py", "tests/unit/test_docs.py"):
        return "docs/lint"
    for layer in (name for name in LAYERS if "/" not in name):  # the layers that are folders of tests/
        if path.startswith(f"tests/{layer}/"):
            return layer
    return "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _layer_reports.setdefault(layer_of(report.nodeid), []).append(report)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """A table of the suite's layers: tests, outcomes, the seconds spent in them and the wall-clock
    span from their first start to their last end (layers overlap when tests run in parallel).
    scripts/test passes the preparation steps it timed itself in DISTRUN_TEST_PREP ("name=seconds,...")."""
    if not _layer_reports:
        return
    rows = []
    for layer in (f"{name}{PYTHON_TAG}" for name in (*LAYERS, "other")):
        reports = _layer_reports.get(layer)
        if not reports:
            continue
        failed = {r.nodeid for r in reports if r.failed}
        rows.append({"layer": layer, "tests": len({r.nodeid for r in reports}),
                     "passed": len({r.nodeid for r in reports if r.when == "call" and r.passed} - failed),
                     "failed": len(failed), "skipped": len({r.nodeid for r in reports if r.skipped}),
                     "test_s": round(sum(r.duration for r in reports), 1),
                     "start": min(r.start for r in reports), "stop": max(r.stop for r in reports)})
    report_dir = os.environ.get("DISTRUN_TEST_REPORT_DIR")
    if report_dir:  # scripts/test merges the streams' tables into one
        Path(report_dir, f"layers-{os.getpid()}.json").write_text(json.dumps(rows))
    terminalreporter.write_sep("=", "time per layer")
    for line in layer_table(rows, os.environ.get("DISTRUN_TEST_PREP", "")):
        terminalreporter.write_line(line)
