"""Each cluster rule has one home: a node's address, its GPU count, the env-prefix default, the
slots rule and the hostfile's text are written once (distrun.inventory.rules and role distrun), and the
roles and the runner use that one place. A second copy of a rule is how two parts of a cluster
come to disagree, so this test fails on one."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import REPO

RULES = "runner/distrun/inventory/rules.py"
DEFAULTS = "roles/distrun/defaults/main.yml"


def code_files() -> list[Path]:
    """The product's code and configuration (documentation and tests are not rules)."""
    files = [REPO / "setup.yml"]
    for top in ("runner", "roles", "playbooks"):
        files += [p for p in (REPO / top).rglob("*") if p.suffix in (".py", ".yml", ".j2", ".sh") and p.is_file()]
    return sorted(files)


def homes(pattern: str) -> set[str]:
    """The files (repo-relative) where pattern occurs."""
    rx = re.compile(pattern)
    return {str(p.relative_to(REPO)) for p in code_files() if rx.search(p.read_text(errors="replace"))}


def test_one_address_rule():
    # No IP-literal regex anywhere: is_ip (ipaddress) is the test, in rules.py alone.
    assert homes(r"\{1,3\}") == set()
    assert homes(r"def _?is_ip\b") == {RULES}
    # The default route's address is read from facts in one place.
    assert homes(r"""["']default_ipv4["']|ansible_default_ipv4""") == {RULES}
    # Every role that needs a node's address asks the rule for it.
    users = homes(r"distrun_node_address")
    assert {"roles/base/vars/main.yml", "roles/shared_fs/vars/main.yml", "roles/slurm/vars/main.yml",
            "roles/ssh_mesh/vars/main.yml"} <= users


def test_one_gpu_rule():
    # GPUs are detected by one role (mpi_env, into the local fact) and counted by one function.
    assert {p for p in homes(r"nvidia-smi") if "/tasks/" in p} == {"roles/mpi_env/tasks/configure.yml"}
    assert homes(r"\^GPU \[0-9\]") == {RULES}
    # The fact's count is read in one place; roles use distrun_gpus / distrun_slots.
    assert homes(r"""\[['"]gpus['"]\]|get\(['"]gpus['"]""") == {RULES}


def test_one_slots_rule_and_one_hostfile_renderer():
    assert homes(r"DEFAULT_SLOTS\s*=") == {RULES}
    assert homes(r"if \w*gpu\w* > 0 else") == {RULES}
    # "host slots=N" is written by rules.hostfile only: the role's template and both runner
    # hostfiles go through it.
    assert homes(r"\}\}? slots=\{") == {RULES}
    assert "distrun_hostfile(hostvars)" in (REPO / "roles/hostfile/templates/hostfile.j2").read_text()


def test_one_env_prefix_default():
    assert homes(r"/opt/distrun/venv") == {DEFAULTS}
    assert homes(r"/opt/miniforge3/envs") == {DEFAULTS}
    # No role falls back to a provider's prefix on its own.
    assert homes(r"""distrun_env_prefix\s*\|\s*default""") == set()


def test_one_mpi_prefix_rule():
    # The distro's Open MPI lives where role mpi_env's vars say; the runner loads those files.
    assert homes(r"_mpi_env_distro_mpi_prefix:") == {"roles/mpi_env/vars/Debian.yml", "roles/mpi_env/vars/RedHat.yml"}
    assert homes(r"""["']/usr["']""") == set()


def test_one_conda_pins_rule():
    # Which conda pins cannot be solved is written once: the runner's inventory check and role
    # mpi_env's assert both ask distrun.inventory.rules.conda_pins.
    assert homes(r"cannot be\W+solved on conda-forge") == {RULES}
    assert homes(r"version\(['\"]4\.1['\"]") == set()
    assert "distrun_conda_pins(" in (REPO / "roles/mpi_env/tasks/assert.yml").read_text()
    assert "rules.conda_pins(" in (REPO / "runner/distrun/inventory/contract.py").read_text()
