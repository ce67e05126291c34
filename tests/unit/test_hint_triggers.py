"""Every hint's trigger is text somebody really prints, so no hint waits for words nobody says.

Two sources count as "really printed": the captured outputs of Open MPI, ssh (through mpirun),
torchrun and Python under tests/unit/data/ (how each was made: data/README.md), and the messages
in distrun's own code and in the workloads (every string literal, an f-string with each
placeholder filled in). diagnosis.py itself, which holds the triggers and the hints, is not a
source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from distrun.run.diagnosis import DIAGNOSES, FALLBACK_DIAGNOSES

from .conftest import REPO

DATA = Path(__file__).parent / "data"
CODE = [*sorted((REPO / "runner" / "distrun").rglob("*.py")), *sorted((REPO / "workloads").glob("*.py")),
        *sorted((REPO / "roles" / "preflight" / "files").glob("probe*.py"))]  # the probe's driver and its checks
# What a placeholder of an f-string stands for: digits match \d+, and also \S+.
FILLER = "7"


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else FILLER for v in node.values)
    return None


def printed_by_code() -> dict[str, str]:
    """file -> every string literal in it, one per line (f-strings with placeholders filled)."""
    out = {}
    for path in CODE:
        if path.name == "diagnosis.py":
            continue
        texts = {t for node in ast.walk(ast.parse(path.read_text())) if (t := _literal(node))}
        out[str(path.relative_to(REPO))] = "\n".join(sorted(texts))
    return out


def captured() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(DATA.rglob("*.txt"))}


SOURCES = {**captured(), **printed_by_code()}
TRIGGERS = [pattern for pattern, _ in (*DIAGNOSES, *FALLBACK_DIAGNOSES)]


def sources_matching(pattern: str) -> list[str]:
    return [name for name, text in SOURCES.items() if re.search(pattern, text)]


@pytest.mark.parametrize("pattern", TRIGGERS)
def test_every_hint_trigger_matches_something_really_printed(pattern):
    assert sources_matching(pattern), (
        f"no captured output under {DATA.relative_to(REPO)} and no message in the code matches {pattern!r}: "
        "the hint can never be shown")


@pytest.mark.parametrize(("pattern", "fallback"), [(p, False) for p, _ in DIAGNOSES] + [(p, True) for p, _ in FALLBACK_DIAGNOSES])
def test_every_hint_is_shown_for_some_captured_launcher_output(pattern, fallback):
    # Stronger than the test above: real launcher output, not only a message in the code. A
    # fallback hint counts only for a capture that no specific trigger explains.
    shown_for = [name for name, text in captured().items() if re.search(pattern, text)
                 and not (fallback and any(re.search(p, text) for p, _ in DIAGNOSES))]
    assert shown_for, f"no capture under {DATA.relative_to(REPO)} shows the hint keyed on {pattern!r}"


def test_a_trigger_nobody_prints_is_caught():
    # The part-count hint once waited for words no trainer printed.
    assert sources_matching(r"does not match the number of MPI ranks") == []
    assert sources_matching(r"has \d+ parts but MPI started \d+ ranks") == ["workloads/common.py"]


def test_the_sources_are_there():
    # An empty corpus would make every trigger fail; a corpus that lost its captures would hide
    # the Open MPI and torchrun texts the triggers are written for.
    assert {"openmpi", "torchrun"} <= {p.parent.name for p in DATA.rglob("*.txt")}
    assert "workloads/common.py" in SOURCES and "runner/distrun/launchers/slurm/driver.py" in SOURCES
