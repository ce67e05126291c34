"""After every other cluster test (``phase(2)``, see tests/conftest.py): no secret in
distrun's records, private run directories, no world-writable shared folder, host keys checked.

The scanner is proven to find planted keys in tests/unit/test_secretscan.py, so a clean scan here
means the records are clean, not that the scanner is blind.
"""

from __future__ import annotations

import json

import pytest

from tests.harness.secretscan import loose_modes, scan

pytestmark = pytest.mark.phase(2)


def _secrets(cluster) -> list[tuple[bytes | str, str]]:
    found: list[tuple[bytes | str, str]] = [(cluster.key.read_text(), "the test cluster's admin private key")]
    mesh = cluster.exec(1, "cat /home/distrun/.ssh/id_ed25519", check=False)
    if mesh.returncode == 0 and mesh.stdout.strip():
        found.append((mesh.stdout, "the training user's mesh private key"))
    for k in range(1, len(cluster.nodes) + 1):
        munge = cluster.exec(k, "base64 -w0 /etc/munge/munge.key 2>/dev/null", check=False)
        if munge.returncode == 0 and munge.stdout.strip():
            import base64

            found.append((base64.b64decode(munge.stdout.strip()), f"node{k}'s munge key"))
    return found


def test_no_secret_in_any_run_record_artifact_log_or_fact_cache(provisioned, distrun_home):
    # At least one check and one setup ran in this session, so there is something to scan.
    assert list((distrun_home / "runs").glob("*-setup-*"))
    findings = scan([distrun_home], _secrets(provisioned))
    assert findings == [], "\n".join(str(f) for f in findings)


def test_run_directories_are_private(provisioned, distrun_home):
    assert loose_modes(distrun_home) == []


def test_no_world_writable_path_in_the_shared_folder(provisioned):
    for k in range(1, len(provisioned.nodes) + 1):
        out = provisioned.exec(k, "find /srv/distrun -perm -0002 ! -type l -print", check=False)
        assert out.stdout.strip() == "", f"node{k}: world-writable: {out.stdout}"


def test_every_recorded_ansible_run_checked_host_keys(provisioned, distrun_home):
    commands = sorted(distrun_home.glob("runs/*/ansible/artifacts/*/command"))
    assert commands
    for f in commands:
        env = json.loads(f.read_text())["env"]
        assert env.get("ANSIBLE_HOST_KEY_CHECKING") == "True", f
