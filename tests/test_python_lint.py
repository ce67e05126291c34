"""ruff and mypy over the runner, its unit tests and the test-only launcher, with the settings in pyproject.toml;
mypy over the preflight's probe as it is composed for the nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    result = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "runner", "tests/unit", "tests/launchers"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_mypy_is_clean():
    result = subprocess.run([str(BIN / "mypy")],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_mypy_is_clean_on_the_composed_probe(tmp_path):
    """The preflight's probe is checked as it travels: its composed source (the head, the identity
    switch, its parts and driver, one namespace) as one module. mypy reads no older Python than
    3.10; the nodes' 3.9 is held by the composed programs' parse (tests/unit/test_nodeprog.py)."""
    from distrun.transport import nodeprog

    (tmp_path / "probe.py").write_text(nodeprog.text("probe"))
    result = subprocess.run([str(BIN / "mypy"), "--python-version", "3.10", "--check-untyped-defs", "--no-incremental",
                             "probe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
