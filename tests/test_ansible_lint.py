"""ansible-lint with the production profile over the whole repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ansible_lint_production_profile_is_clean():
    lint = Path(sys.executable).parent / "ansible-lint"
    result = subprocess.run(
        [str(lint), "--profile", "production", "--offline", "--nocolor"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "Passed" in result.stderr + result.stdout
