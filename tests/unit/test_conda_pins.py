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


CHECK_PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's check of the env's Open MPI
      ansible.builtin.include_role:
        name: mpi_env
        tasks_from: conda_check.yml
"""
INSTALLER = ROOT / "tests" / "doubles" / "fake-miniforge-installer.sh"


def check_env(tmp_path: Path, channel: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    """Install the fake Miniforge, solve the pinned spec against a fake channel, run the role's check."""
    miniforge, env_prefix = tmp_path / "miniforge", tmp_path / "env"
    subprocess.run(["bash", str(INSTALLER), "-b", "-p", str(miniforge)], check=True, capture_output=True)
    if channel is not None:
        (miniforge / "fake-channel.json").write_text(json.dumps(channel))
    spec = tmp_path / "environment.yml"
    spec.write_text("dependencies:\n  - python=3.11\n  - openmpi=4.1.6\n  - mpi4py\n")
    conda = str(miniforge / "bin" / "conda")
    subprocess.run([conda, "env", "create", "--prefix", str(env_prefix), "--file", str(spec)], check=True, capture_output=True)
    play = tmp_path / "check.yml"
    play.write_text(CHECK_PLAY)
    extra = {"ansible_python_interpreter": sys.executable, "_mpi_env_conda": conda, "mpi_env_prefix": str(env_prefix), "mpi_env_conda_openmpi_version": "4.1.6"}
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", str(play), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_role_check_fails_when_the_channel_installs_another_openmpi(tmp_path: Path) -> None:
    result = check_env(tmp_path, {"openmpi": "4.1.5"})
    assert result.returncode != 0
    assert f"{tmp_path / 'env'} lacks openmpi=4.1.6: conda list says" in result.stdout
    assert '"version": "4.1.5"' in result.stdout


def test_the_role_check_passes_when_the_pinned_openmpi_is_installed(tmp_path: Path) -> None:
    result = check_env(tmp_path, {"openmpi": "4.1.6"})
    assert result.returncode == 0, result.stdout + result.stderr
