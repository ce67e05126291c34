"""roles/mpi_env refuses conda pins that conda-forge cannot solve, before anything is installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason=f"{PLAYBOOK} is not installed")

PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's checks only
      ansible.builtin.include_role:
        name: mpi_env
        tasks_from: assert.yml
"""


def run_checks(tmp_path: Path, **pins: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    extra = {"mpi_env_provider": "conda", "ansible_facts": {"os_family": "Debian", "architecture": "x86_64"}, **pins}
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1")
    args = [str(PLAYBOOK), "-i", "localhost,", str(play)]
    args += ["-e", json.dumps(extra)]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_python_311_with_openmpi_405_is_refused_with_the_fix(tmp_path: Path) -> None:
    result = run_checks(tmp_path, mpi_env_conda_python_version="3.11", mpi_env_conda_openmpi_version="4.0.5")
    assert result.returncode != 0
    assert "mpi_env_conda_python_version=3.11 with mpi_env_conda_openmpi_version=4.0.5 cannot be solved" in result.stdout
    assert 'set mpi_env_conda_openmpi_version to "4.1.6"' in result.stdout


@pytest.mark.parametrize(("python", "openmpi"), [("3.9", "4.0.5"), ("3.11", "4.1.6")])
def test_solvable_pins_pass(tmp_path: Path, python: str, openmpi: str) -> None:
    result = run_checks(tmp_path, mpi_env_conda_python_version=python, mpi_env_conda_openmpi_version=openmpi)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_defaults_pass(tmp_path: Path) -> None:
    result = run_checks(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
