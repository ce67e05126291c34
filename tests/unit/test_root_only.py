"""Setup installs as root from paths the inventory names (a wheelhouse, local packages, conda
channels, the env's own pip): role distrun's module distrun_root_only refuses any of them that
anyone but root can change, the path or any folder above it, links followed. Run on real folders;
the tests chown to another uid, so they need root (as the build machines and CI run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.modules import load_file

REPO = Path(__file__).resolve().parents[2]
JOB_UID = 4242  # the training user: any uid but root's
FIX = "make it root-owned and not writable by others, outside the shared folder, and run distrun setup again"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _load(path: Path, name: str):
    return load_file(path, name)


@pytest.fixture(scope="module")
def m():
    return _load(REPO / "roles" / "distrun" / "library" / "distrun_root_only.py", "distrun_root_only")


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """A root-only folder (pytest's tmp_path lies in root's private folder)."""
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:
        assert parent.stat().st_uid == 0, f"{parent} is not root's: the test needs a root-only tmp dir"
    return tmp_path


def _check(m, name: str, path: Path | str, host: str = "node2") -> list[str]:
    return m.problems([{"name": name, "path": str(path)}], host, {0})


def test_a_root_only_wheelhouse_passes_and_so_does_a_path_not_made_yet(m, root):
    (root / "wheels").mkdir(mode=0o755)
    (root / "wheels" / "torch.whl").write_text("")
    assert _check(m, "mpi_env_wheelhouse", root / "wheels") == []
    assert _check(m, "distrun_env_prefix", root / "opt" / "venv") == []  # root makes it later


def test_a_wheelhouse_below_the_training_users_shared_folder_names_that_folder(m, root):
    shared = root / "srv" / "distrun"
    (shared / "wheels").mkdir(parents=True)
    os.chown(shared, JOB_UID, JOB_UID)  # the shared folder's top is the training user's
    found = _check(m, "mpi_env_wheelhouse", shared / "wheels", host="node3")
    assert found == [f"mpi_env_wheelhouse {shared}/wheels on node3 can be changed by others than root: "
                     f"{shared} is owned by uid {JOB_UID}; {FIX}"]
    # Not made yet below it: the job could make it first.
    assert _check(m, "mpi_env_wheelhouse", shared / "later")[0].startswith(
        f"mpi_env_wheelhouse {shared}/later on node2 can be changed by others than root: {shared} is owned by")


def test_a_folder_or_file_others_may_write_is_refused_whoever_owns_it(m, root):
    (root / "wheels").mkdir()
    os.chmod(root / "wheels", 0o775)
    assert f"{root}/wheels is writable by group" in _check(m, "mpi_env_wheelhouse", root / "wheels")[0]
    os.chmod(root / "wheels", 0o757)
    assert f"{root}/wheels is writable by everyone" in _check(m, "mpi_env_wheelhouse", root / "wheels")[0]
    (root / "pkg.whl").write_text("")
    os.chmod(root / "pkg.whl", 0o666)
    assert _check(m, "mpi_env_packages", root / "pkg.whl") == [
        f"mpi_env_packages {root}/pkg.whl on node2 can be changed by others than root: "
        f"{root}/pkg.whl is writable by everyone; {FIX}"]


def test_a_link_is_followed_and_its_target_checked(m, root):
    shared = root / "shared"
    (shared / "wheels").mkdir(parents=True)
    os.chown(shared / "wheels", JOB_UID, JOB_UID)
    (root / "wheelhouse").symlink_to(shared / "wheels")  # root's own link, to the job's folder
    assert _check(m, "mpi_env_wheelhouse", root / "wheelhouse") == [
        f"mpi_env_wheelhouse {root}/wheelhouse on node2 can be changed by others than root: "
        f"{shared}/wheels is owned by uid {JOB_UID} (through the link {root}/wheelhouse -> {shared}/wheels); {FIX}"]
    # A relative link inside a safe tree is fine.
    os.chown(shared / "wheels", 0, 0)
    (root / "rel").symlink_to("shared/wheels")
    assert _check(m, "mpi_env_wheelhouse", root / "rel") == []
    (root / "loop").symlink_to(root / "loop")
    assert "starts a loop of links" in _check(m, "mpi_env_wheelhouse", root / "loop" / "x")[0]


def test_a_sticky_folder_protects_roots_entries_but_not_a_name_anyone_may_take(m, root):
    tmp = root / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    (tmp / "wheels").mkdir(mode=0o755)
    assert _check(m, "mpi_env_wheelhouse", tmp / "wheels") == []
    assert f"{tmp} is writable by others and {tmp}/later does not exist yet" in \
        _check(m, "mpi_env_wheelhouse", tmp / "later")[0]
    assert f"{tmp} is writable by everyone" in _check(m, "mpi_env_wheelhouse", tmp)[0]


def test_a_relative_path_is_refused_and_every_problem_is_one_clause_of_one_line(m, root):
    (root / "w").mkdir()
    os.chown(root / "w", JOB_UID, 0)
    found = m.problems([{"name": "mpi_env_wheelhouse", "path": "wheels"},
                        {"name": "mpi_env_packages", "path": str(root / "w" / "a.whl")}], "node1", {0})
    assert found[0] == ("mpi_env_wheelhouse wheels on node1 is not an absolute path: give the absolute path "
                        "of a root-owned folder or file and run distrun setup again")
    assert found[1].endswith(f"{root}/w is owned by uid {JOB_UID}; {FIX}")
    assert all("\n" not in line for line in found)


def test_the_controllers_admin_may_own_the_installer_file(m, root):
    (root / "admin").mkdir()
    os.chown(root / "admin", JOB_UID, JOB_UID)
    (root / "admin" / "Miniforge3.sh").write_text("")
    installer = [{"name": "mpi_env_conda_installer_file", "path": str(root / "admin" / "Miniforge3.sh")}]
    assert m.problems(installer, "the controller", {0, JOB_UID}) == []
    assert m.problems(installer, "the controller", {0})[0].endswith(f"{root}/admin is owned by uid {JOB_UID}; {FIX}")


@pytest.fixture(scope="module")
def local_sources():
    sys.modules.pop("distrun_cluster", None)
    return _load(REPO / "roles" / "distrun" / "filter_plugins" / "distrun_cluster.py", "distrun_cluster").local_sources


@pytest.mark.parametrize("spec, path", [
    ("torch==2.13.0+cpu", None), ("numpy<2", None), ("https://example.org/x.whl", None), ("conda-forge", None),
    ("/srv/distrun/pkg.whl", "/srv/distrun/pkg.whl"), ("./pkg.whl", "./pkg.whl"), ("~distrun/pkg", "~distrun/pkg"),
    ("file:///srv/mirror/conda-forge", "/srv/mirror/conda-forge"),
    ("mypkg @ file:///srv/distrun/mypkg-1.0-py3-none-any.whl", "/srv/distrun/mypkg-1.0-py3-none-any.whl"),
    ("-r /srv/distrun/requirements.txt", "/srv/distrun/requirements.txt"),
    ("--requirement=/srv/distrun/req.txt", "/srv/distrun/req.txt"),
])
def test_the_local_paths_among_package_specs_and_channels_are_found(local_sources, spec, path):
    assert local_sources([spec], "mpi_env_packages") == ([{"name": "mpi_env_packages", "path": path}] if path else [])


def test_a_wheelhouse_is_a_path_unless_it_is_a_url(local_sources):
    assert local_sources("wheels", "mpi_env_wheelhouse", paths=True) == [{"name": "mpi_env_wheelhouse", "path": "wheels"}]
    assert local_sources("https://mirror.example/wheels/", "mpi_env_wheelhouse", paths=True) == []
    assert local_sources("", "mpi_env_wheelhouse", paths=True) == []


PLAY = """
- name: Check the package sources the way setup does
  hosts: head
  gather_facts: true
  gather_subset: [min]
  roles: [mpi_env]
"""


@pytest.mark.parametrize("tag", ["mpi_env_assert", "mpi_env_packages"])
def test_role_mpi_env_refuses_the_wheelhouse_before_installing_even_with_only_the_install_tag(root, tmp_path, tag):
    """Role mpi_env on this machine (local connection, only the checks: the tags stop before any
    install): a wheelhouse below a folder of another user stops the host with the line."""
    shared = root / "srv"
    (shared / "wheels").mkdir(parents=True)
    os.chown(shared, JOB_UID, JOB_UID)
    (root / "hosts.yml").write_text(
        "all:\n  vars:\n    ansible_connection: local\n    ansible_python_interpreter: /usr/bin/python3\n"
        "  children:\n    head:\n      hosts:\n        localhost:\n    workers:\n      hosts:\n        localhost:\n")
    (root / "play.yml").write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_LOCAL_TEMP": str(root / "local")}

    def play(wheelhouse: Path) -> subprocess.CompletedProcess:
        # Only the checks run: with the tag of the install step, pip itself would run next, so
        # --check keeps this test from installing anything on this machine.
        return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(root / "hosts.yml"),
                               "--check", "--tags", tag, "-e", json.dumps({
                                   "mpi_env_wheelhouse": str(wheelhouse), "mpi_env_packages": [], "mpi_env_venv_base_packages": []}),
                               str(root / "play.yml")], capture_output=True, text=True, env=env, timeout=300)

    bad = play(shared / "wheels")
    assert bad.returncode != 0
    assert (f"mpi_env_wheelhouse {shared}/wheels on localhost can be changed by others than root: "
            f"{shared} is owned by uid {JOB_UID}; {FIX}") in bad.stdout, bad.stdout[-3000:]
    os.chown(shared, 0, 0)
    good = play(shared / "wheels")
    assert good.returncode == 0, good.stdout[-3000:]
