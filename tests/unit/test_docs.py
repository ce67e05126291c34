"""The docs stay true: the role reference matches the roles, runnable blocks run, links resolve.

A fenced block whose info string is ``sh runnable`` (see docs/index.md) is run here, line by
line, from the repository root with ``.venv/bin`` first on PATH and DISTRUN_HOME in a temporary
directory; every line must exit 0. Only commands that touch no node may be marked (dry runs,
``distrun hostfile``, ``--help``, ``ansible-inventory --list``, ``scripts/gen-role-docs --check``):
the test refuses any other.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

DOCS = REPO / "docs"
GEN = REPO / "scripts" / "gen-role-docs"
FENCE_RE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def doc_files() -> list[Path]:
    files = sorted(DOCS.rglob("*.md"))
    readme = REPO / "README.md"
    return [readme, *files] if readme.is_file() else files


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of every fenced block whose info string is ``sh runnable``."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").split()
        body: list[str] = []
        start = i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if info[:2] == ["sh", "runnable"]:
            blocks.append((start, "\n".join(body)))
    return blocks


def commands(body: str) -> list[str]:
    """One command per line; a trailing backslash continues it; blank and comment lines skipped."""
    out: list[str] = []
    pending = ""
    for raw in body.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append(line)
    if pending.strip():
        out.append(pending.strip())
    return out


def is_node_free(command: str) -> bool:
    """Commands that never contact a node. Anything else must not be marked runnable."""
    words = shlex.split(command, comments=True)
    if not words or any(w in {";", "&&", "||", "|", ">", ">>", "<"} for w in words):
        return False
    tool, args = words[0], words[1:]
    if tool == "distrun":
        if "--help" in args or "-h" in args or args == ["--version"]:
            return True
        if args[:1] == ["hostfile"]:
            return True
        return args[:1] == ["train"] and "--dry-run" in args
    if tool == "ansible-inventory":
        return "--list" in args or "--graph" in args
    if tool == "scripts/gen-role-docs":
        return args == ["--check"]
    return False


def all_runnable() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in doc_files():
        for line_no, body in runnable_blocks(path.read_text()):
            for cmd in commands(body):
                found.append((f"{path.relative_to(REPO)}:{line_no}", cmd))
    return found


RUNNABLE = all_runnable()


@pytest.fixture
def docs_env(tmp_path):
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["DISTRUN_HOME"] = str(tmp_path / "distrun-home")
    env["COLUMNS"] = "200"
    return env


def test_role_reference_is_up_to_date():
    result = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr or result.stdout


def test_gen_role_docs_check_names_the_stale_file(tmp_path):
    stale = tmp_path / "roles.md"
    stale.write_text("# stale\n")
    result = subprocess.run([sys.executable, str(GEN), "--check", "--output", str(stale)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "roles.md is out of date" in lines[0], result.stderr


def test_role_reference_lists_every_option():
    import yaml

    text = (DOCS / "roles.md").read_text()
    for spec_file in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        assert f"## Role {role}" in text
        for entry, spec in (yaml.safe_load(spec_file.read_text())["argument_specs"] or {}).items():
            assert f"entry point `{entry}`" in text, (role, entry)
            for option in (spec or {}).get("options") or {}:
                assert f"| `{option}` |" in text, (role, entry, option)


def test_docs_have_runnable_blocks():
    # The guide's walkthroughs mark their node-free commands; losing them all means the
    # convention (or the extractor) broke.
    assert len(RUNNABLE) >= 5, RUNNABLE


def test_extractor_reads_the_convention():
    text = "```sh runnable\n# comment\ndistrun --help\ndistrun train -i local \\\n  --dry-run\n```\n```sh\ndistrun setup -i prod\n```\n"
    assert [c for _, b in runnable_blocks(text) for c in commands(b)] == [
        "distrun --help", "distrun train -i local --dry-run"]


@pytest.mark.parametrize(("command", "ok"), [
    ("distrun train --inventory local --dry-run", True),
    ("distrun hostfile --inventory sample-prod", True),
    ("ansible-inventory -i inventory/sample-prod --list", True),
    ("distrun train --inventory local", False),
    ("distrun setup --inventory local", False),
    ("distrun check --inventory local", False),
    ("distrun train -i local --dry-run && distrun setup -i local", False),
    ("rm -rf /tmp/x", False),
])
def test_only_node_free_commands_may_be_marked(command, ok):
    assert is_node_free(command) is ok


@pytest.mark.parametrize(("where", "command"), RUNNABLE, ids=[f"{w} {c}"[:90] for w, c in RUNNABLE])
def test_runnable_block_line_exits_zero(where, command, docs_env):
    assert is_node_free(command), f"{where}: '{command}' may touch a node; do not mark it runnable"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=REPO,
                            env=docs_env, timeout=180)
    assert result.returncode == 0, f"{where}: '{command}' exited {result.returncode}\n{result.stderr[-2000:]}"


LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(md: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    found: set[str] = set()
    in_fence = False
    for line in md.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if m and not in_fence:
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("path", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    missing = []
    for target in LINK_RE.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part) if file_part else path
        if not dest.exists():
            missing.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            missing.append(target)
    assert not missing, f"{path.relative_to(REPO)}: broken links {missing}"


def test_index_links_every_guide_page():
    index = (DOCS / "index.md").read_text()
    for page in sorted((DOCS / "guide").glob("*.md")):
        assert f"guide/{page.name}" in index, page.name
    assert "roles.md" in index
