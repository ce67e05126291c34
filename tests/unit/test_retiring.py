"""The record layouts distrun still reads but no longer writes (store/retiring.py) go when their
release comes: this fails once the package's version reaches READ_UNTIL, and it holds the list of
their readers to the code."""

from __future__ import annotations

import ast
import tomllib

import pytest

from distrun.store import retiring

from .conftest import REPO

PACKAGE = REPO / "runner" / "distrun"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_older_record_layouts_are_read_only_until_their_release():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert _version(version) < _version(retiring.READ_UNTIL), (
        f"distrun {version} still reads the record layouts of store/retiring.py, read until {retiring.READ_UNTIL}: "
        f"remove each of them from the code READERS names (and their tests), then the module")


def _defines(path, name: str) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


@pytest.mark.parametrize("form", sorted(retiring.READERS))
def test_every_reader_of_an_older_layout_is_listed_where_it_is(form):
    assert hasattr(retiring, form), form
    for reader in retiring.READERS[form]:
        module, name = reader.split(":")
        path = PACKAGE / module
        assert path.is_file() and _defines(path, name), f"store/retiring.py names {reader}, which is not there"
        assert "retiring" in path.read_text(), f"{module} reads {form} without naming store/retiring.py"


def test_every_constant_of_the_module_is_a_form_with_its_readers():
    forms = {n for n in vars(retiring) if n.isupper() and n not in ("READ_UNTIL", "READERS")}
    assert forms == set(retiring.READERS)
