from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _role_module_utils() -> None:
    """Role distrun's module_utils under the names Ansible gives them, so the roles' modules
    import in a test as they do on a node (ansible.module_utils.distrun_fsuser)."""
    import ansible.module_utils

    from tests.harness.modules import load_file

    for path in sorted((REPO / "roles" / "distrun" / "module_utils").glob("*.py")):
        name = f"ansible.module_utils.{path.stem}"
        if name not in sys.modules:
            setattr(ansible.module_utils, path.stem, load_file(path, name, register=True))


_role_module_utils()


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    """Each test gets its own run directories and fact cache."""
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)  # a developer's default must not leak in
    return tmp_path / "state"


@pytest.fixture
def write_inventory(tmp_path):
    def write(text: str, name: str = "hosts.yml") -> Path:
        path = tmp_path / "inv" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return write


def distrun_bin() -> str:
    return str(Path(sys.executable).parent / "distrun")


@pytest.fixture
def cli_env(private_state):
    env = dict(os.environ)
    env["DISTRUN_HOME"] = str(private_state)
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def alone_with_run_tags():
    """A claim counts every process of the user on the host that carries another run's tag, and
    here every "host" is this machine: two test processes side by side (the suite runs the unit
    tests on two Pythons at once) take turns for the tests that claim or tag."""
    with open(Path(os.environ.get("TMPDIR", "/tmp")) / "distrun-unit-run-tags.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def as_golden(text: str) -> str:
    """Output as the golden files hold it: the installed relay's name carries its text's digest
    (tests/unit/test_relay.py checks it), a golden file names it by its place only."""
    from distrun.transport import nodeprog

    return text.replace(nodeprog.installed("relay"), "/usr/local/lib/distrun/relay-DIGEST.py")
