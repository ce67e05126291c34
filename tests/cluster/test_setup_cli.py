"""`distrun setup --inventory test` on the 3-node podman cluster: converge, then changed=0."""

from __future__ import annotations

from .conftest import distrun


def test_first_setup_converges_every_node(first_setup):
    assert first_setup.rc == 0, first_setup.stdout[-4000:] + first_setup.stderr[-2000:]
    recap = first_setup.recap()
    assert recap["hosts"] == 3
    assert recap["failed"] == 0 and recap["unreachable"] == 0
    assert recap["changed"] > 0


def test_second_setup_changes_nothing(provisioned):
    again = distrun("setup", "--inventory", "test")
    assert again.rc == 0, again.stdout[-4000:]
    assert again.recap()["changed"] == 0, again.stdout[-6000:]


def test_setup_check_mode_reports_no_pending_change(provisioned):
    checked = distrun("setup", "--inventory", "test", "--check")
    assert checked.rc == 0, checked.stdout[-4000:]
    assert checked.recap()["changed"] == 0, checked.stdout[-6000:]


def test_run_records_are_private(provisioned, distrun_home):
    runs = sorted((distrun_home / "runs").iterdir())
    assert runs, "setup left no run record"
    for run in runs:
        assert oct(run.stat().st_mode & 0o777) == "0o700"
        # ansible-runner's artifacts are there, events included.
        assert list(run.glob("ansible/artifacts/*/job_events/*.json"))
