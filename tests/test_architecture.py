"""The code's shape, held: module size, DEVELOPING's module table, Ansible's public interfaces only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "runner" / "distrun"
LIMIT = 300  # lines per module (DEVELOPING: one idea per module)
# Modules over the limit, each at most as long as it is now: they may shrink, never grow, and
# one that is back under the limit leaves this list.
CEILINGS = {
    "roles/job/files/node.py": 400,
    "roles/preflight/files/probe.py": 741,
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


def test_developings_module_table_names_every_module_and_only_modules():
    table = set(re.findall(r"^\| `([^`]+?)/?` \|", (REPO / "DEVELOPING.md").read_text(), re.M))
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    named = {t for t in table if t.endswith(".py") and "/" not in t}
    assert files - named == set(), f"modules without a row in DEVELOPING.md's table: {sorted(files - named)}"
    assert named - files == set(), f"rows of DEVELOPING.md's table without a module: {sorted(named - files)}"
    assert folders <= table, f"packages without a row in DEVELOPING.md's table: {sorted(folders - table)}"


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
