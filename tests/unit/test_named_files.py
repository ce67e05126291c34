"""Every file of the repository that the code's docstrings and comments, the roles and the docs
name is there: a module moved or renamed takes the sentences that point at it along, or fails
here. Beside test_docs_name_what_exists.py (the guides' commands, links and backticked paths),
this reads the prose too, and the code.

What counts as a name, so that nothing else does:
- a path from the repository's top: a known top-level folder, then folders, then a file with an
  extension or a folder with its trailing slash (``runner/distrun/store/runs.py``, ``tests/unit/``);
- in the runner and DEVELOPING.md, a module by its layer (``store/runs.py``, under runner/distrun);
- ``role job's files/sign.py``: a role's file by the role's name;
- in the runner's and the node programs' comments and docstrings, a module by its bare name
  (``rundir.py``): some Python file of the repository has that name, or it is another project's
  (THEIRS). A name in quotes is a file the code opens, not a pointer.
A placeholder (``<run>``, ``{host}``, ``*``, ``$X``) never starts, ends or continues one.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from .conftest import REPO

PACKAGE = REPO / "runner" / "distrun"
TOP = ("runner", "roles", "tests", "scripts", "docs", "playbooks", "inventory", "bench", "workloads", "molecule", ".ci")
LAYERS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
_EXT = r"(?:py|md|ya?ml|json|j2|sh|txt|cfg|toml|ini|png|conf)"
_SEG = r"[A-Za-z0-9_.-]+"
_NOT_BEFORE = r"(?<![\w./<>{$*\-])"
_NOT_AFTER = r"(?![\w/<>{*])"
REPO_PATH = re.compile(rf"{_NOT_BEFORE}((?:{'|'.join(map(re.escape, TOP))})/(?:{_SEG}/)*(?:{_SEG}\.{_EXT}|{_SEG}/)){_NOT_AFTER}")
LAYER_PATH = re.compile(rf"{_NOT_BEFORE}((?:{'|'.join(LAYERS)})/{_SEG}\.py){_NOT_AFTER}")
ROLE_PATH = re.compile(rf"\brole `?(\w+)`?'s `?((?:files|tasks|templates|defaults|vars|library|module_utils|filter_plugins|meta|handlers)"
                       rf"/(?:{_SEG}/)*{_SEG}\.{_EXT})")
BARE = re.compile(r"(?<![\w./<>{$*\-'\"])([a-z_][a-z0-9_]*\.py)\b(?![/'\"])")

# The user's own, in the guides' examples: no file of the repository.
EXAMPLES = ("inventory/prod/",)
# Other projects' files the runner's prose names by their bare name.
THEIRS = {"dist_partition.py"}  # JittorGeometric's partitioner, an example of --prepare

CODE = sorted([*PACKAGE.rglob("*.py"), *REPO.glob("roles/*/files/*.py")])
ROLES = sorted(p for pattern in ("roles/**/*.md", "roles/**/*.yml", "roles/**/*.j2", "roles/*/library/*.py",
                                 "roles/*/module_utils/*.py", "roles/*/filter_plugins/*.py")
               for p in REPO.glob(pattern))
PAGES = sorted([REPO / "README.md", REPO / "DEVELOPING.md", *REPO.glob("docs/**/*.md")])


def _prose(source: str) -> str:
    """A Python file's comments and strings (its docstrings among them), one per line."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or tok.type == tokenize.STRING:
            out.append(tok.string)
    return "\n".join(out)


def named(path: Path, text: str) -> list[str]:
    """The names of repository files in ``text`` (from ``path``) that are not there."""
    missing = []
    in_runner = PACKAGE in path.parents or path.name == "DEVELOPING.md"
    for ref in (m.group(1).rstrip(".") for m in REPO_PATH.finditer(text)):
        if not ref.startswith(EXAMPLES) and not (REPO / ref).exists() and not (in_runner and (PACKAGE / ref).exists()):
            missing.append(ref)
    if in_runner:
        missing += [m.group(1) for m in LAYER_PATH.finditer(text) if not (PACKAGE / m.group(1)).exists()]
    missing += [f"roles/{m.group(1)}/{m.group(2)}" for m in ROLE_PATH.finditer(text)
                if not (REPO / "roles" / m.group(1) / m.group(2)).exists()]
    return missing


def _python_names() -> set[str]:
    return {p.name for top in ("runner", "roles", "tests", "scripts", "bench", "workloads") for p in (REPO / top).rglob("*.py")}


def test_every_file_the_code_the_roles_and_the_docs_name_is_there():
    problems = []
    for path in [*CODE, *ROLES, *PAGES]:
        text = path.read_text()
        problems += [f"{path.relative_to(REPO)}: {ref} does not exist" for ref in named(path, text)]
    assert not problems, "\n".join(problems)


def test_every_module_the_code_names_by_its_bare_name_is_one():
    modules = _python_names() | THEIRS
    problems = []
    for path in CODE:
        for name in sorted(set(BARE.findall(_prose(path.read_text())))):
            if name not in modules:
                problems.append(f"{path.relative_to(REPO)}: {name} is no file of the repository")
    assert not problems, "\n".join(problems)


def test_the_names_found_are_many():
    """The patterns find what the prose names (a pattern that matched nothing would pass the tests above)."""
    found = sum(len(REPO_PATH.findall(p.read_text())) for p in [*CODE, *ROLES, *PAGES])
    layered = sum(len(LAYER_PATH.findall(p.read_text())) for p in [*CODE, REPO / "DEVELOPING.md"])
    roles = sum(len(ROLE_PATH.findall(p.read_text())) for p in [*CODE, *ROLES, *PAGES])
    assert found > 250 and layered > 100 and roles > 10, (found, layered, roles)


@pytest.mark.parametrize(("text", "missing"), [
    ("see runner/distrun/transport/rundir.py", []),
    ("see runner/distrun/transport/run_dir.py.", ["runner/distrun/transport/run_dir.py"]),
    ("the tests in tests/unit/, then tests/units/", ["tests/units/"]),
    ("role job's files/sign.py and role job's files/signer.py", ["roles/job/files/signer.py"]),
    ("store/runs.py, store/run.py", ["store/run.py"]),
    ("runs/<run>/plan.json, roles/<role>/files/x.py, docs/{page}.md, tests/*/x.py, $HOME/docs/x.md", []),
    ("inventory/prod/hosts.yml, an example", []),
])
def test_a_stale_name_is_caught_and_a_placeholder_is_not(text, missing):
    assert named(PACKAGE / "example.py", text) == missing


def test_a_bare_module_name_counts_in_prose_only():
    source = '"""Started by launch.py, then lunch.py."""\nopen("version.py")  # see rundir.py\n'
    assert BARE.findall(_prose(source)) == ["launch.py", "lunch.py", "rundir.py"]
    assert "lunch.py" not in _python_names() and "launch.py" in _python_names()
