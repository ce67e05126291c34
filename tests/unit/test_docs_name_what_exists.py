"""What README.md and the guides name exists: every `distrun VERB --flag` they show is a verb
with that option (program arguments after `--` aside), every file or folder of the repository
they point at (a link, or a path in backticks such as `runner/distrun/planning/run_files.py`) is
there, and every DISTRUN_* variable they tell users to set is one the code reads. A guide that
outlives the code it describes fails here, not in a user's hands."""

from __future__ import annotations

import difflib
import re
import shlex

import click
import pytest

from distrun.cli.main import main

from .conftest import REPO

VERBS = dict(main.commands)
PAGES = [REPO / "README.md", REPO / "DEVELOPING.md", *sorted((REPO / "docs" / "guide").glob("*.md")), REPO / "docs" / "index.md"]
TOP = ("runner/", "roles/", "tests/", "docs/", "playbooks/", "scripts/", "inventory/", "bench/", "workloads/", "molecule/",
       ".ci/", "setup.yml", "ansible.cfg", "pyproject.toml")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# Paths the pages use as examples of the user's own, not files of the repository.
EXAMPLES = {"inventory/prod", "inventory/prod/hosts.yml", "inventory/prod/group_vars/all.yml",
            "inventory/gpus/default"}  # dry-run's "slots from inventory/gpus/default": three words, not a path
_STOP = {"|", "||", "&&", ";", ">", ">>", "2>&1", "<", "&", "#"}


def _snippets(text: str) -> list[tuple[str, bool]]:
    """Code: every line of a fenced block and every inline code span, each with whether it is
    a command to type (a shell block or a span) rather than what a program printed (a text block)."""
    out: list[tuple[str, bool]] = []
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S):
        typed = m.group(1).split()[:1] in ([], ["sh"], ["bash"], ["console"], ["shell"])
        out += [(line, typed) for line in m.group(2).splitlines()]
    out += [(span, True) for span in _SPAN.findall(_FENCE.sub("", text))]
    return out


def _words(snippet: str) -> list[str]:
    snippet = snippet.replace("$(", " ")
    try:
        words = shlex.split(snippet, comments=True)
    except ValueError:
        words = snippet.split()
    return [w[:-1] if w.endswith(")") and w.count("(") < w.count(")") else w for w in words]


def commands(text: str) -> list[tuple[str, list[str]]]:
    """Each `distrun VERB ARGS` a page shows: the verb and its words up to a shell operator or
    '--'. In what a program printed (a text block, an error line) only a known verb counts: the
    text also says 'distrun keeps ...'."""
    found = []
    for snippet, typed in _snippets(text):
        words = _words(snippet)
        for i, word in enumerate(words):
            if word != "distrun" or i + 1 >= len(words):
                continue
            verb, rest = words[i + 1], []
            for w in words[i + 2:]:
                if w in _STOP or w == "--" or w == "distrun":
                    break
                rest.append(w)
            starts = i == 0 or words[i - 1] in _STOP or "=" in words[i - 1] or words[i - 1] in ("sudo", "exec", "time")
            # A command typed with a word that is no verb but close to one (a verb renamed, a typo)
            # counts; 'distrun mesh key on X: refused' in a table of messages does not.
            near = difflib.get_close_matches(verb, list(VERBS), n=1, cutoff=0.75)
            if verb in VERBS or (typed and starts and (near or verb.startswith("-"))):
                found.append((verb, rest))
    return found


def _options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*getattr(p, "opts", []), *getattr(p, "secondary_opts", []))} | {"-h", "--help"}




def _placeholder(word: str) -> bool:
    return bool(re.search(r"[<>{}*$]|\.\.\.|^VERB$|^COMMAND$", word))


def test_every_distrun_command_a_page_shows_is_a_verb_with_those_options():
    problems, seen = [], 0
    for page in PAGES:
        for verb, rest in commands(page.read_text()):
            seen += 1
            where = f"{page.relative_to(REPO)}: distrun {verb} {' '.join(rest)}".rstrip()
            if verb.startswith("-"):
                if verb not in ("--help", "-h", "--version"):
                    problems.append(f"{where}: distrun has no option {verb} before a verb")
                continue
            if _placeholder(verb):
                continue
            command = VERBS.get(verb)
            if command is None:
                problems.append(f"{where}: no verb {verb!r}")
                continue
            known = _options(command)
            takes_value = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                           for o in p.opts}
            words = iter(rest)
            for word in words:
                if word.startswith("-") and len(word) > 1 and not _placeholder(word):
                    name = word.split("=", 1)[0]
                    if name not in known and not re.fullmatch(r"-[0-9.]+", name):
                        problems.append(f"{where}: {verb} has no option {name}")
                    if name in takes_value and "=" not in word:
                        next(words, None)  # its value, which may start with '-' (--launcher-args '--mca ...')
    assert seen > 150, seen  # the pages show their commands: the extractor found them
    assert not problems, "\n".join(problems)


def _paths(text: str) -> list[str]:
    found = [m for m in _LINK.findall(text) if not m.startswith(("http://", "https://", "#", "mailto:"))]
    for span in _SPAN.findall(text):
        for word in span.split():
            word = word.strip(",;:()'\"")
            if word.startswith(TOP) and not _placeholder(word):
                found.append(word)
    return found


def test_every_file_a_page_points_at_is_there():
    problems, seen = [], 0
    for page in PAGES:
        for ref in _paths(page.read_text()):
            path = ref.split("#", 1)[0].rstrip("/")
            if not path or _placeholder(path):
                continue
            seen += 1
            if path in EXAMPLES:
                continue
            # Beside the page, at the repository's top, or (DEVELOPING.md's module table) in the package.
            places = [page.parent / path, REPO / path, REPO / "runner" / "distrun" / path,
                      REPO / "runner" / "distrun" / f"{path}.py"]
            if not any(p.exists() for p in places):
                problems.append(f"{page.relative_to(REPO)}: {ref} does not exist")
    assert seen > 100, seen
    assert not problems, "\n".join(problems)


def test_every_distrun_variable_a_page_names_is_read_by_the_code():
    code = "\n".join(p.read_text(errors="replace") for d in ("runner", "roles", "scripts", "workloads", "tests/harness",
                                                               "bench", ".ci")
                     for p in (REPO / d).rglob("*") if p.is_file() and p.suffix in (".py", ".yml", ".j2", ".sh", ""))
    problems = []
    for page in PAGES:
        for name in sorted(set(re.findall(r"\bDISTRUN_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))):
            if name not in code:
                problems.append(f"{page.relative_to(REPO)}: {name} is read nowhere")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("snippet,verb,words", [
    ("distrun train -i prod --epochs 3 -- --lr 0.1 | tee log", "train", ["-i", "prod", "--epochs", "3"]),
    ("out=$(distrun show last --json)", "show", ["last", "--json"]),
])
def test_the_extractor_reads_a_command_as_a_shell_would(snippet, verb, words):
    assert commands(f"`{snippet}`") == [(verb, words)]


def test_a_flag_no_verb_has_is_caught():
    (verb, rest), = commands("```sh\ndistrun train -i prod --ephocs 3\n```\n")
    assert "--ephocs" not in _options(VERBS[verb]) and "--epochs" in _options(VERBS[verb]) and rest[-2] == "--ephocs"


def test_a_renamed_verb_is_caught_and_prose_is_not():
    assert commands("`distrun push-images IMG -i prod`") == [("push-images", ["IMG", "-i", "prod"])]
    assert commands("`distrun mesh key on X: refused`") == []
    assert commands("```text\ndistrun keeps the mounts it saw\n```\n") == []


def test_every_launcher_is_in_the_guides_that_list_the_launchers():
    """A launcher added to the registry is in the script guide's table of how Python is started
    and in the map from the wiki's manual steps (the ssh launcher was missing from both)."""
    from distrun.launchers import LAUNCHERS

    script = (REPO / "docs" / "guide" / "your-own-script.md").read_text()
    manual = (REPO / "docs" / "guide" / "from-manual-steps.md").read_text()
    missing = [f"your-own-script.md: no row for `{n}`" for n in LAUNCHERS if f"| `{n}`" not in script]
    missing += [f"from-manual-steps.md: no --launcher {n}" for n in LAUNCHERS if f"--launcher {n}" not in manual]
    assert not missing, "\n".join(missing)


def test_every_option_distrun_gives_torchrun_is_in_the_guides():
    """The options distrun's torchrun command carries are those the guides show (is_host and
    --local-addr were missing, and an image's torch must know each of them)."""
    from distrun.launchers import launcher_named

    from .plans import plan_for
    from .test_launchers import MIXED, cluster

    plan = plan_for(cluster(MIXED), run_id="r1", launcher="torchrun")
    torchrun = launcher_named("torchrun")
    argv = torchrun.command(plan, torchrun.launch_hosts(plan)[0])
    options = {w.split("=", 1)[0] + ("=" + w.split("=")[1] if w.startswith("--rdzv-conf") else "")
               for w in argv[1:argv.index("--no-python") + 1] if w.startswith("--")}
    for page in ("your-own-script.md", "from-manual-steps.md"):
        text = (REPO / "docs" / "guide" / page).read_text()
        missing = sorted(o for o in options if o not in text)
        assert not missing, f"{page} does not show {missing}"
