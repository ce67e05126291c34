"""Every molecule scenario, run as a test: create, converge, idempotence, verify, destroy.

The whole setup.yml in its default form (venv, sync) is converged, re-run and verified on the
harness cluster by tests/cluster (test_setup_cli.py); the scenarios here cover the variants:
sshfs, nfs (rendered) and conda (with the installer double).

Molecule's own sequence fails on a second converge that reports changes, so a pass here is the
idempotence check too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import podcluster
from tests.harness.ansible_log import failed_tasks

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


@pytest.fixture(scope="module")
def node_image() -> str:
    try:
        podcluster.ensure_podman()
        return podcluster.build_image().ref
    except podcluster.HarnessError as exc:
        pytest.fail(f"podman cannot run molecule's nodes on this machine: {exc}", pytrace=False)


@pytest.mark.cluster
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str, node_image: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["DISTRUN_NODE_IMAGE"] = node_image
    env["MOLECULE_NO_LOG"] = "false"
    log = tmp_path / f"molecule-{scenario}.log"
    with log.open("w") as fh:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "molecule"), "test", "-s", scenario],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=1800,
        )
    text = log.read_text(errors="replace")
    assert result.returncode == 0, (f"molecule test -s {scenario} failed (whole log: {log}):\n"
                                    f"{failed_tasks(text) or 'no failed task in the log'}\n--- last lines ---\n{text[-3000:]}")
