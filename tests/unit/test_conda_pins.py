"""Conda pins that conda-forge cannot solve are refused: by the runner when it reads the inventory
(before any play runs) and by role mpi_env before it installs anything, with one rule
(distrun.inventory.rules.conda_pins); after a solve, the role's check fails a host whose env holds another
Open MPI than the pin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from distrun.inventory import contract, rules

from .conftest import distrun_bin

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason=f"{PLAYBOOK} is not installed")

def run_role_tasks(tmp_path: Path, tasks_from: str, extra: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    """One task file of role mpi_env, as the role runs it, on localhost with these variables."""
    play = tmp_path / f"play-{tasks_from}"
    play.write_text(f"""\
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Tasks {tasks_from} of role mpi_env
      ansible.builtin.include_role:
        name: mpi_env
        tasks_from: {tasks_from}
""")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1")
    # The role's own modules run here too (its guard of the paths root installs from): under the
    # Python running these tests, never whatever interpreter discovery would find first.
    extra = {"ansible_python_interpreter": sys.executable, **extra}
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", str(play), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def run_checks(tmp_path: Path, **pins: object) -> subprocess.CompletedProcess[str]:
    facts = {"os_family": "Debian", "architecture": "x86_64"}
    return run_role_tasks(tmp_path, "assert.yml", {"mpi_env_provider": "conda", "ansible_facts": facts, **pins})


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


def test_the_role_refuses_a_python_read_as_a_number(tmp_path: Path) -> None:
    result = run_checks(tmp_path, mpi_env_conda_python_version=3.10)
    assert result.returncode != 0
    assert "mpi_env_conda_python_version is the number 3.1 (a bare 3.10 reads as 3.1)" in result.stdout


@pytest.mark.parametrize(("python", "openmpi", "refused"), [
    ("3.11", "4.0.5", True), ("3.10", "4.0", True), ("3.12", "4.0.*", True), ("3.13", "3.1.6", True),
    ("3.9", "4.0.5", False), ("3.8", "4.0.5", False), ("3.11", "4.1.6", False), ("3.10", "4.1.0", False),
    ("3.11", "5.0.5", False), ("3", "4.0.5", False), ("3.11", "4", False), ("3.11", ">=4.0", False),
    (3.11, "4.1.6", False), (3.9, "4.0.5", False), (3.1, "4.1.6", True),
])
def test_the_rule(python: object, openmpi: object, refused: bool) -> None:
    # A pin conda could still meet with a solvable build (a bare major, a range) is left to conda.
    assert bool(rules.conda_pins(python, openmpi)) is refused


def test_the_fix_names_the_roles_default() -> None:
    defaults = yaml.safe_load((ROOT / "roles/mpi_env/defaults/main.yml").read_text())
    assert defaults["mpi_env_conda_openmpi_version"] == rules.CONDA_OPENMPI_SOLVES
    assert rules.conda_pins(defaults["mpi_env_conda_python_version"], defaults["mpi_env_conda_openmpi_version"]) == ""


def test_the_runner_refuses_only_conda_hosts() -> None:
    pins = {"mpi_env_conda_python_version": "3.11", "mpi_env_conda_openmpi_version": "4.0.5"}
    hostvars = {"a": {"distrun_mpi_provider": "conda", **pins}, "b": {"distrun_mpi_provider": "venv", **pins},
                "c": {"distrun_mpi_provider": "venv", "mpi_env_provider": "conda", **pins},
                "d": {"distrun_mpi_provider": "conda", "distrun_slurm_existing": True, **pins},
                "e": {"distrun_mpi_provider": "conda", "mpi_env_conda_python_version": "{{ py }}",
                      "mpi_env_conda_openmpi_version": "4.0.5"}}
    assert contract.conda_pins_problems(hostvars) == [f"hosts a, c: {rules.conda_pins('3.11', '4.0.5')}"]


def test_a_solvable_conda_inventory_is_read(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """The refusal is no blanket one: Python 3.9 keeps the wiki's Open MPI 4.0.5."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        'distrun_mpi_provider: conda\nmpi_env_conda_python_version: "3.9"\nmpi_env_conda_openmpi_version: "4.0.5"\n')
    (tmp_path / "hosts.ini").write_text("[head]\na ansible_host=192.0.2.1\n[workers]\na\nb ansible_host=192.0.2.2\n")
    proc = subprocess.run([distrun_bin(), "hostfile", "-i", str(tmp_path / "hosts.ini")], capture_output=True, text=True,
                          env=cli_env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["a slots=1", "b slots=1"]


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
    extra = {"ansible_python_interpreter": sys.executable, "_mpi_env_conda": conda, "mpi_env_prefix": str(env_prefix),
             "mpi_env_conda_openmpi_version": "4.1.6"}
    return run_role_tasks(tmp_path, "conda_check.yml", extra)


def test_the_role_check_fails_when_the_channel_installs_another_openmpi(tmp_path: Path) -> None:
    result = check_env(tmp_path, {"openmpi": "4.1.5"})
    assert result.returncode != 0
    assert f"{tmp_path / 'env'} lacks openmpi=4.1.6: conda list says" in result.stdout
    assert '"version": "4.1.5"' in result.stdout


def test_the_role_check_passes_when_the_pinned_openmpi_is_installed(tmp_path: Path) -> None:
    result = check_env(tmp_path, {"openmpi": "4.1.6"})
    assert result.returncode == 0, result.stdout + result.stderr
