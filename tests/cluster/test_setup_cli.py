"""`distrun setup --inventory test` on the 3-node podman cluster: converge, check mode with
nothing pending, then the verify playbook (tests/verify/cluster.yml) checks what a user of the
cluster would see. The second converge (changed=0) is test_hostile_setup.py's last step: a full
setup after the planted links are gone, which runs before this module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness.ansible_log import failed_tasks

from .conftest import REPO, distrun


def test_first_setup_converges_every_node(first_setup):
    assert first_setup.rc == 0, first_setup.stdout[-4000:] + first_setup.stderr[-2000:]
    recap = first_setup.recap()
    assert recap["hosts"] == 3
    assert recap["failed"] == 0 and recap["unreachable"] == 0
    assert recap["changed"] > 0


def test_setup_check_mode_reports_no_pending_change(provisioned):
    checked = distrun("setup", "--inventory", "test", "--check")
    assert checked.rc == 0, checked.stdout[-4000:]
    assert checked.recap()["changed"] == 0, checked.stdout[-6000:]


def test_run_records_are_private(provisioned, distrun_home):
    runs = sorted((distrun_home / "runs").iterdir())
    assert runs, "setup left no run record"
    for run in runs:
        assert oct(run.stat().st_mode & 0o777) == "0o700"
    # A setup's record holds ansible-runner's artifacts, events included (a train refused before
    # any playbook ran has none).
    setups = [run for run in runs if "-setup-" in run.name]
    assert setups and all(list(run.glob("ansible/artifacts/*/job_events/*.json")) for run in setups), setups


def test_provisioned_cluster_passes_the_verify_playbook(provisioned):
    """systemd and the wheelhouse on every node, ssh between all nodes as the training user, the
    env found by non-interactive ssh, the hostfile, a file synced from the head, a 3-rank mpi4py
    allreduce on 3 hosts, torch importable."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(provisioned.inventory),
                           "-e", "verify_import_torch=true", str(REPO / "tests" / "verify" / "cluster.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (failed_tasks(proc.stdout) or "no failed task in the output") + "\n" + proc.stdout[-3000:] + proc.stderr[-2000:]
