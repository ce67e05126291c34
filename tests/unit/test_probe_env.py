"""The probe's record of the env's versions, run for real as root: an env whose Python counts its
starts, a record folder under tmp. A run's probe starts the env's Python only when something the
answer depends on changed, 'distrun check' (the full set) always does, and a record a job could
have written, or one of a broken env, is never read."""

from __future__ import annotations

import json
import os
import platform
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.transport.remote import USER_SSH

from .probe_text import probe_text
from .test_probe_ssh import run_probe

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the probe keeps env records only as root (a job, running as the training user, "
                              "could write its own); these tests need root, as CI runs them")

ANSWER = {"python": "3.11.0", "_modules": {}, "mpi4py": "4.0.0", "torch": "absent", "jittor": "absent",
          "env lock": "sha256:1", "_mpi4py": "ok: Fake MPI 1"}


@pytest.fixture()
def env(tmp_path) -> Path:
    """An env whose bin/python answers the probe's env script and notes each start."""
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    dist = prefix / "lib" / "python3.11" / "site-packages" / "mpi4py-4.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Name: mpi4py\nVersion: 4.0.0\n")
    answer(prefix, ANSWER)
    return prefix


def answer(prefix: Path, said: dict) -> None:
    """What the env's Python says: read from beside the env, so changing it changes nothing the
    probe looks at."""
    (prefix.parent / "answer.json").write_text(json.dumps(said) + "\n")
    python = prefix / "bin" / "python"
    if not python.exists():
        python.write_text(f"#!/bin/sh\necho start >> {prefix.parent}/starts\ncat {prefix.parent}/answer.json\n")
        python.chmod(0o755)


def probe(env: Path, records: Path, **cfg) -> tuple[dict, int]:
    found = run_probe(env_prefix=str(env), env_records_dir=str(records), **cfg)
    counted = env.parent / "starts"  # outside the env: counting changes nothing the probe looks at
    starts = counted.read_text().count("start") if counted.exists() else 0
    return found, starts


def test_a_runs_probe_reads_the_record_until_the_env_changes(env, tmp_path):
    records = tmp_path / "records"
    first, starts = probe(env, records)
    assert first["env_probe"] == "ran" and starts == 1
    assert first["versions"]["mpi4py"] == "4.0.0" and first["mpi4py"]["ok"]
    [record] = records.iterdir()
    assert stat.S_IMODE(records.stat().st_mode) == 0o700 and stat.S_IMODE(record.stat().st_mode) == 0o600
    again, starts = probe(env, records)
    assert again["env_probe"] == "recorded" and starts == 1
    assert {k: again[k] for k in ("env", "versions", "mpi4py")} == {k: first[k] for k in ("env", "versions", "mpi4py")}
    # A package's metadata edited in place (its folder's entries unchanged) is a change too.
    meta = env / "lib" / "python3.11" / "site-packages" / "mpi4py-4.0.0.dist-info" / "METADATA"
    answer(env, {**ANSWER, "mpi4py": "0.0.1"})
    with open(meta, "a") as fh:
        fh.write("\n")
    changed, starts = probe(env, records)
    assert changed["env_probe"] == "ran" and starts == 2 and changed["versions"]["mpi4py"] == "0.0.1"
    # A package installed beside it; the modules the run asks for.
    (env / "lib" / "python3.11" / "site-packages" / "torch-2.13.0.dist-info").mkdir()
    assert probe(env, records)[1] == 3 and probe(env, records)[1] == 3
    assert probe(env, records, modules=["torch"])[0]["env_probe"] == "ran"


def test_the_full_set_always_starts_the_env_and_renews_the_record(env, tmp_path):
    records = tmp_path / "records"
    probe(env, records)
    found, starts = probe(env, records, env_records=False)
    assert found["env_probe"] == "ran" and starts == 2
    assert probe(env, records)[0]["env_probe"] == "recorded"


def test_a_broken_env_is_never_recorded(env, tmp_path):
    records = tmp_path / "records"
    answer(env, {**ANSWER, "_mpi4py": "error: ImportError: libmpi.so.40: cannot open shared object file"})
    for n in (1, 2):
        found, starts = probe(env, records)
        assert found["env_probe"] == "ran" and starts == n and not found["mpi4py"]["ok"]
    assert not records.exists() or not list(records.iterdir())


@pytest.mark.parametrize("plant", ["group-readable", "link", "other-owner", "stale"])
def test_a_record_root_did_not_write_as_its_own_is_not_read(env, tmp_path, plant):
    records = tmp_path / "records"
    probe(env, records)
    assert probe(env, records)[0]["env_probe"] == "recorded"  # as written, the record is read
    [record] = records.iterdir()
    data = json.loads(record.read_text())
    if plant == "group-readable":
        record.chmod(0o644)
    elif plant == "link":
        real = tmp_path / "elsewhere.json"
        real.write_text(json.dumps(data))
        real.chmod(0o600)
        record.unlink()
        record.symlink_to(real)
    elif plant == "other-owner":
        os.chown(record, 65534, 65534)
    else:
        record.write_text(json.dumps({**data, "time": data["time"] - 2 * 86400}))
    found, starts = probe(env, records)
    assert found["env_probe"] == "ran" and starts == 2


def test_a_planted_json_module_cannot_forge_the_envs_versions(tmp_path):
    """A job can write the training user's home, where the env's Python used to start: a json.py
    there (or in PYTHONPATH, or the user's site folder) ran inside the probe and forged what
    'check' reports and root records. The probe runs as the role runs it (-I -S), from that folder."""
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    home = tmp_path / "home"
    home.mkdir()
    (home / "json.py").write_text('print(\'{"python": "forged", "mpi4py": "9.9.9"}\')\nraise SystemExit(0)\n')
    config = {"host": "here", "user": "root", "env_prefix": str(prefix), "mpi_prefix": "", "shared_dir": "/tmp",
              "ssh_timeout": 2, "user_ssh": list(USER_SSH), "env_records_dir": str(tmp_path / "records")}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe_text(), json.dumps(config)], cwd=home,
                         env={**os.environ, "PYTHONPATH": str(home)}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["versions"]["python"] == platform.python_version()
    assert "9.9.9" not in out.stdout
