"""ruff and mypy over the runner, its unit tests and the test-only launcher, with the settings in pyproject.toml."""

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
