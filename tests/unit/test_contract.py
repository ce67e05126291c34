"""The runner and the roles agree on the contract's defaults (DEVELOPING.md)."""

from __future__ import annotations

import re

import pytest

from distrun import contract

from .conftest import REPO

DEFAULTS = sorted((REPO / "roles").glob("*/defaults/main.yml"))
EXPECTED = {
    "distrun_user": contract.DEFAULT_USER,
    "distrun_shared_dir": contract.DEFAULT_SHARED_DIR,
    "distrun_mpi_provider": contract.DEFAULT_MPI_PROVIDER,
    "distrun_shared_fs_mode": contract.DEFAULT_SHARED_FS_MODE,
}


def test_every_role_has_defaults_and_argument_specs():
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
    assert len(roles) >= 7
    for role in roles:
        assert (REPO / "roles" / role / "meta" / "argument_specs.yml").is_file(), role
        assert (REPO / "roles" / role / "README.md").is_file(), role


@pytest.mark.parametrize("defaults", DEFAULTS, ids=[p.parent.parent.name for p in DEFAULTS])
def test_role_defaults_state_the_contract_values(defaults):
    text = defaults.read_text()
    seen = 0
    for var, value in EXPECTED.items():
        for m in re.finditer(rf"{var}\s*\|\s*default\(\s*'([^']*)'", text):
            seen += 1
            assert m.group(1) == value, f"{defaults}: {var} defaults to {m.group(1)!r}, the runner assumes {value!r}"
    venv = re.search(r"default\('(/[^']+)' if \S+ == 'venv'", text)
    if venv:
        assert venv.group(1) == contract.DEFAULT_ENV_PREFIX["venv"]
    assert seen or venv or "distrun_" not in text, f"{defaults} reads distrun_* variables in a form this test does not know"


def test_conda_env_prefix_default_matches():
    text = (REPO / "roles" / "mpi_env" / "defaults" / "main.yml").read_text()
    prefix = re.search(r"^mpi_env_conda_prefix:\s*\"?([^\"\n]+)", text, re.M).group(1).strip()
    name = re.search(r"^mpi_env_conda_env_name:\s*\"?([^\"\n]+)", text, re.M).group(1).strip()
    assert f"{prefix}/envs/{name}" == contract.DEFAULT_ENV_PREFIX["conda"]
