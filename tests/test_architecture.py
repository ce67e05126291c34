"""The code's shape, held: module size, DEVELOPING's module table, Ansible's public interfaces only."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "runner" / "distrun"
LIMIT = 300  # lines per module (DEVELOPING: one idea per module)
# Modules over the limit, each at most as long as it is now: they may shrink, never grow, and
# one that is back under the limit leaves this list.
CEILINGS = {
    "roles/job/files/node.py": 398,
}


def _modules() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *REPO.glob("roles/*/files/*.py")])


def test_no_module_grows_past_its_limit():
    over = {}
    for path in _modules():
        rel = str(path.relative_to(REPO))
        lines = len(path.read_text().splitlines())
        ceiling = CEILINGS.get(rel, LIMIT)
        if lines > ceiling:
            over[rel] = (lines, ceiling)
    assert not over, f"modules over their line limit (lines, limit): {over}: split them by idea"


def test_a_module_back_under_the_limit_leaves_the_list():
    listed = {rel: len((REPO / rel).read_text().splitlines()) for rel in CEILINGS if (REPO / rel).is_file()}
    assert set(listed) == set(CEILINGS), f"listed modules that no longer exist: {set(CEILINGS) - set(listed)}"
    under = {rel: n for rel, n in listed.items() if n <= LIMIT}
    assert not under, f"back under {LIMIT} lines, remove from CEILINGS: {under}"


# The modules every layer uses; any other module lives in the folder of its layer.
FOUNDATION = {"errors.py", "paths.py", "terminating.py", "printable.py"}


def _table() -> dict[str, str]:
    """DEVELOPING.md's module table: a row's first cell (a module or a folder) -> its idea."""
    rows = re.findall(r"^\| `([^`]+?)` \| (.*?) \| .*\|$", (REPO / "DEVELOPING.md").read_text(), re.M)
    return dict(rows)


def _packages() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def test_developings_module_table_names_every_module_and_only_modules():
    table = _table()
    files = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    files |= {f"{pkg.name}/{p.name}" for pkg in _packages() if pkg.name != "launchers"
              for p in pkg.glob("*.py") if p.name != "__init__.py"}
    named = {t for t in table if t.endswith(".py")}
    assert files - named == set(), f"modules without a row in DEVELOPING.md's table: {sorted(files - named)}"
    assert named - files == set(), f"rows of DEVELOPING.md's table without a module: {sorted(named - files)}"
    folders = {f"{p.name}/" for p in _packages()}
    assert folders <= set(table), f"packages without a row in DEVELOPING.md's table: {sorted(folders - set(table))}"


def test_every_module_lives_in_the_folder_of_its_layer():
    loose = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"} - FOUNDATION
    assert not loose, f"modules outside a layer's folder (move each into cli/, run/, ...): {sorted(loose)}"
    strays = [str(p.relative_to(PACKAGE)) for pkg in _packages() if pkg.name != "launchers"
              for p in pkg.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert not strays, f"folders below a layer (the tree is two levels deep): {strays}"


def _words(text: str) -> str:
    return " ".join(text.split()).rstrip(".").lower()


def test_each_layers_row_in_developing_is_its_packages_docstring():
    table = _table()
    differ = {}
    for pkg in _packages():
        if pkg.name == "launchers":
            continue
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
        first = doc.split("\n\n")[0]
        if _words(first) != _words(table.get(f"{pkg.name}/", "")):
            differ[pkg.name] = (first, table.get(f"{pkg.name}/"))
    assert not differ, f"folders whose __init__ docstring is not their row in DEVELOPING.md: {differ}"


PRIVATE_ANSIBLE = ("_internal", "_collection_finder", "_load_config_defs", "_read_config_yaml_file", "_meta_yml_to_dict")


def test_the_runner_uses_only_ansibles_public_interfaces():
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module + "." + a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            for name in names:
                parts = name.split(".")
                if (parts[0] in ("ansible", "ansible_runner") and any(p.startswith("_") for p in parts[1:])) \
                        or name in PRIVATE_ANSIBLE:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert not found, f"private Ansible in the runner: {found}"


LAUNCHER_NAMES = {"mpirun", "torchrun", "slurm", "ssh"}


def _names_a_launcher(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "launcher" or name.endswith("_launcher")


def test_nothing_outside_the_launchers_and_the_cli_branches_on_a_launchers_name():
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("launchers", "cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            consts = set()
            for side in sides:
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    consts.add(side.value)
                elif isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                    consts |= {e.value for e in side.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if consts & LAUNCHER_NAMES and any(_names_a_launcher(s) for s in sides):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"a launcher's name compared outside launchers/ (declare it on the Launcher instead): {found}"


# A launcher is its own files and one line that registers it: the files a new launcher needs.
OUTSIDE_LAUNCHER = REPO / "tests" / "launchers" / "podlet"
NEW_LAUNCHER_FILES = 2  # podlet's: its Launcher (__init__.py) and its node side (kubelet.py)
PRODUCT = ("runner", "roles", "playbooks", "setup.yml", "ansible.cfg", "docs/guide")


def test_each_shipped_launcher_lives_in_a_module_of_its_own_and_one_registry_line_names_it():
    from distrun.launchers import LAUNCHERS

    registry = (PACKAGE / "launchers" / "__init__.py").read_text()
    for name, launcher in LAUNCHERS.items():
        module = type(launcher).__module__.split(".")
        assert module[:2] == ["distrun", "launchers"] and module[2] not in ("base", "options"), (name, module)
        # Its class, once, in the registry's one line, and nowhere else in that file.
        line = next(ln for ln in registry.splitlines() if ln.startswith("LAUNCHERS: dict[str, Launcher] ="))
        assert registry.count(f"{type(launcher).__name__}()") == 1 and f"{type(launcher).__name__}()" in line


def test_a_launcher_from_outside_is_its_package_and_one_line_and_distrun_names_it_nowhere(tmp_path):
    """The test-only podlet: NEW_LAUNCHER_FILES files of its own, registered by one line
    (DISTRUN_LAUNCHERS); no file of distrun names it, yet the command line's choices, the help's
    exit codes, the files a run brings home and where its ranks' logs are found all take it."""
    files = sorted(p.name for p in OUTSIDE_LAUNCHER.iterdir() if p.is_file() and p.suffix == ".py")
    assert len(files) == NEW_LAUNCHER_FILES, files
    named = []
    for top in PRODUCT:
        for path in [REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and "podlet" in path.read_text(errors="replace"):
                named.append(str(path.relative_to(REPO)))
    assert not named, f"distrun's own files name the test-only launcher: {named}"
    probe = (
        "from distrun.launchers import LAUNCHERS, exit_codes\n"
        "from distrun.run.collect_rules import run_end_selection\n"
        "from distrun.run import diagnosis\n"
        "import json, pathlib, sys\n"
        "d = pathlib.Path(sys.argv[1]) / 'node1' / 'attempts' / '0' / 'pods'\n"
        "d.mkdir(parents=True)\n"
        "(d / '2.log').write_text('DISTRUN_RANK rank=2 local_rank=0 world_size=3 host=node1\\n')\n"
        "print(json.dumps({'names': list(LAUNCHERS), 'codes': dict(exit_codes()),\n"
        "                  'collected': [p for p in run_end_selection().patterns if 'pods' in p],\n"
        "                  'logs': {str(k): str(v) for k, v in diagnosis.rank_logs(pathlib.Path(sys.argv[1])).items()}}))\n")
    env = {**os.environ, "DISTRUN_LAUNCHERS": "tests.launchers.podlet:Podlet", "PYTHONPATH": f"{REPO}:{REPO / 'runner'}"}
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["names"][-1] == "podlet" and "podlet: a pod was evicted" in got["codes"]["12"]
    assert "attempts/*/pods/*" in got["collected"] and got["logs"] == {"2": str(tmp_path / "node1/attempts/0/pods/2.log")}
    helped = subprocess.run([str(Path(sys.executable).parent / "distrun"), "train", "--help"], capture_output=True,
                            text=True, env={**env, "COLUMNS": "200"}, timeout=60, check=False)
    assert "podlet" in helped.stdout and helped.returncode == 0


def _behaviour_classes(path: Path) -> list[str]:
    """The module's classes that are not plain records (dataclasses, enums, exceptions)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        bases = [ast.unparse(b) for b in node.bases]
        if any(d.startswith("dataclass") for d in decorators) or \
                any(b in ("StrEnum", "IntEnum", "Enum", "Exception", "UserError", "NamedTuple") for b in bases):
            continue
        found.append(node.name)
    return found


def test_no_module_of_run_holds_two_classes_of_an_attempts_life():
    """run/'s rooms: the attempt's state machine, its start, its launchers' start, its claim, its
    upload, its end, the run around its attempts: each its own module (records beside them)."""
    crowded = {p.name: names for p in sorted((PACKAGE / "run").glob("*.py")) if len(names := _behaviour_classes(p)) > 1}
    assert not crowded, f"modules of run/ holding more than one class: {crowded}"
