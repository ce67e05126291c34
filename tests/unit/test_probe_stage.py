"""A run's first attempt checked and staged in one round trip: the preflight's probe runs role
job's stage script after its own checks of the user and the shared folder, as the training user,
and says what it unpacked and which of the run's folders it made; a refused run's folders and
upload are removed again. For real on this machine, as its current user."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.run import staging
from distrun.transport import nodeprog
from distrun.transport.remote import USER_SSH

from .probe_text import probe_text
from .test_security import SECRET, local_upload

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "roles" / "preflight" / "files" / "probe.py"
ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture()
def uploaded(tmp_path):
    """A run's files uploaded for this machine's user, as 'distrun train' sends them ahead."""
    up = local_upload(tmp_path, "p")
    yield up["cluster"], up["host"], up["run_id"], up["gate"].read_text().strip()
    up["incoming"].unlink(missing_ok=True)


def probe(shared: Path, run_id: str, upload: str, **cfg) -> dict:
    stage = {"run_id": run_id, "run_dir": str(shared / "runs" / run_id), "checkpoint_dir": str(shared / "checkpoints" / run_id),
             "shared_dir": str(shared), "workloads_digest": "d1", "upload": upload}
    config = {"host": "here", "user": ME, "env_prefix": "/nonexistent", "mpi_prefix": "", "shared_dir": str(shared),
              "ssh_timeout": 2, "user_ssh": list(USER_SSH), "stage": stage, **cfg}
    out = subprocess.run([sys.executable, "-c", probe_text(), json.dumps(config), nodeprog.text("stage")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert SECRET not in out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_probe_stages_the_run_in_its_round_trip_and_a_refusal_removes_it(tmp_path, uploaded):
    cluster, host, run_id, upload = uploaded
    shared = tmp_path / "shared"
    shared.mkdir()
    found = probe(shared, run_id, upload)
    # The checks are reported as ever (this machine has no distrun env: the judge would refuse).
    assert found["setup"]["ok"] is False
    run_dir, checkpoints = shared / "runs" / run_id, shared / "checkpoints" / run_id
    assert found["staged"] == run_id and found["stage_created"] == [str(run_dir), str(checkpoints)]
    assert (run_dir / "hostfile").read_text() == "n1 slots=1\n"
    assert (run_dir / "env.sh").read_text() == f"export TOKEN='{SECRET}'\n"
    # What the runner starts on: the probe's answer that it unpacked this run.
    from distrun.run.starter import PlaybookEvent, staged_run
    assert staged_run(PlaybookEvent("ok", host, "probe", data={"stdout": json.dumps(found)})) == run_id
    # Refused: the folders the probe made are removed, the shared folder's other runs are not.
    other = shared / "runs" / "other-run"
    other.mkdir()
    staging.discard(cluster, [host], run_id, created={host: found["stage_created"]})
    assert not run_dir.exists() and not checkpoints.exists() and other.is_dir()


@pytest.mark.parametrize("case", ["missing folder", "not mounted"])
def test_the_probe_stages_nothing_where_the_shared_folder_fails_its_own_checks(tmp_path, uploaded, case):
    """An empty mount point is writable too: a node whose shared folder is not mounted (or not
    there) gets nothing written, and says why; the judge refuses it on the same checks."""
    _, _, run_id, upload = uploaded
    shared = tmp_path / "shared"
    if case == "missing folder":
        found = probe(shared, run_id, upload)
        assert found["stage_error"] == f"not staged: {shared} does not exist"
    else:
        shared.mkdir()
        found = probe(shared, run_id, upload, mount_fstypes=["nfs*"])
        assert found["stage_error"] == f"not staged: {shared} is not mounted (expected nfs*)"
    assert "staged" not in found and not (shared / "runs").exists()
