"""One home for the contract's defaults: role distrun states them, every role and the runner read them."""

from __future__ import annotations

import re

import pytest
import yaml

from distrun.inventory import contract

from .conftest import REPO

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
CONTRACT = ("distrun_user", "distrun_shared_dir", "distrun_shared_fs_mode", "distrun_mpi_provider", "distrun_env_prefix",
            "distrun_hostfile")


def test_every_role_has_defaults_and_argument_specs():
    assert len(ROLES) >= 8
    for role in ROLES:
        assert (REPO / "roles" / role / "meta" / "argument_specs.yml").is_file(), role
        assert (REPO / "roles" / role / "README.md").is_file(), role


@pytest.mark.parametrize("role", [r for r in ROLES if r != "distrun"])
def test_every_role_depends_on_the_defaults_role(role):
    meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())
    deps = [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]
    assert "distrun" in deps, f"roles/{role}/meta/main.yml: add 'role: distrun' to dependencies"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_restates_a_contract_default(role):
    for path in sorted((REPO / "roles" / role).rglob("*")):
        if path.suffix not in (".yml", ".j2"):
            continue
        for var in CONTRACT:
            found = re.search(rf"\b{var}\s*\|\s*default\(", path.read_text())
            assert not found, f"{path}: {var} has its default in roles/distrun/defaults/main.yml; read it as is"


def test_the_runner_reads_the_roles_defaults():
    data = yaml.safe_load((REPO / "roles" / "distrun" / "defaults" / "main.yml").read_text())
    assert contract.default("distrun_user") == data["distrun_user"] == "distrun"
    assert contract.default("distrun_shared_dir") == data["distrun_shared_dir"]
    assert contract.choices("distrun_mpi_provider") == ("venv", "conda")
    assert contract.choices("distrun_shared_fs_mode") == ("nfs", "sshfs", "sync", "external")
    for provider in contract.choices("distrun_mpi_provider"):
        assert contract.env_prefix_default(provider) == data["distrun_env_prefixes"][provider]


def test_the_conda_env_default_lies_under_the_conda_prefix():
    text = (REPO / "roles" / "mpi_env" / "defaults" / "main.yml").read_text()
    found = re.search(r"^mpi_env_conda_prefix:\s*\"?([^\"\n]+)", text, re.M)
    assert found, "roles/mpi_env/defaults/main.yml: no mpi_env_conda_prefix"
    prefix = found.group(1).strip()
    assert contract.env_prefix_default("conda").startswith(prefix + "/envs/")


def test_the_distro_mpi_prefix_comes_from_role_mpi_env():
    assert contract.distro_mpi_prefix("Debian") == "/usr"
    assert contract.distro_mpi_prefix("RedHat") == "/usr/lib64/openmpi"
    assert contract.distro_mpi_prefix("Gentoo") == "/usr"  # an OS the role does not know: Debian's


def test_the_runner_reads_the_files_as_yamls_safe_loader_does():
    # The runner reads them with libyaml where PyYAML has it: every value must be the same.
    for relative in ("roles/distrun/defaults/main.yml", "roles/distrun/meta/argument_specs.yml",
                     *(f"roles/mpi_env/vars/{p.name}" for p in sorted((REPO / "roles" / "mpi_env" / "vars").glob("*.yml")))):
        expected = yaml.safe_load((REPO / relative).read_text())
        assert contract._load(relative) == expected, relative
