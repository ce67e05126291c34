"""A file of the project imported by its path: what is no module of an importable package (a
role's Ansible module or module_utils, a node program, a filter plugin, a bench script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str | None = None, *, register: bool = False) -> ModuleType:
    """The module that the Python file at path makes, under name (its stem by default); with
    register, also in sys.modules under that name before it runs (as an import would place it)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, f"{path} is not a Python file"
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
