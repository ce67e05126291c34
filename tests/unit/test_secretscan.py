"""The secrets scanner finds what it must, so the cluster suite's clean scan means something."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.harness.secretscan import loose_modes, scan


@pytest.fixture(scope="module")
def keypair(tmp_path_factory):
    d = tmp_path_factory.mktemp("key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "planted", "-f", str(d / "id")], check=True)
    return (d / "id").read_text()


def test_a_clean_run_directory_has_no_findings(tmp_path, keypair):
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "meta.json").write_text('{"status": "ok", "ssh": "ssh-ed25519 AAAAC3Nz public"}')
    assert scan([tmp_path], [(keypair, "the planted key")]) == []


def test_a_planted_private_key_block_is_found(tmp_path, keypair):
    f = tmp_path / "runs" / "r1" / "ansible" / "artifacts" / "x" / "stdout"
    f.parent.mkdir(parents=True)
    f.write_text("TASK [copy]\n" + keypair)
    found = scan([tmp_path])
    assert [(x.path, x.what) for x in found] == [(f, "a private key block")]


def test_key_material_quoted_in_json_without_its_header_is_found(tmp_path, keypair):
    body = "\n".join(ln for ln in keypair.splitlines() if not ln.startswith("-----"))
    f = tmp_path / "job_events" / "1-ok.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"stdout": "key was " + body}))
    found = scan([tmp_path], [(keypair, "the cluster's admin key")])
    assert [x.what for x in found] == ["material of the cluster's admin key"]


def test_a_binary_munge_key_is_found_raw_or_in_base64(tmp_path):
    munge = bytes(range(256)) * 4
    (tmp_path / "raw.bin").write_bytes(b"xx" + munge)
    import base64

    (tmp_path / "b64.txt").write_bytes(b"key: " + base64.b64encode(munge))
    found = sorted(x.path.name for x in scan([tmp_path], [(munge, "munge key")]))
    assert found == ["b64.txt", "raw.bin"]


def test_run_directories_must_be_private(tmp_path):
    run = tmp_path / "runs" / "r1"
    (run / "ansible").mkdir(parents=True)
    for d in (tmp_path, tmp_path / "runs", run, run / "ansible"):
        d.chmod(0o700)
    assert loose_modes(tmp_path) == []
    run.chmod(0o755)
    assert loose_modes(tmp_path) == [f"{run}: mode 0755, want 0700"]
