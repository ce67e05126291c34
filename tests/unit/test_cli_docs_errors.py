"""The error texts the guides quote are texts the code prints: every 'distrun: error: ...' line,
every check line ('✗ check on node: ...', 'fix: ...') and every text quoted after 'refuses' or
'says' in docs/guide and the README must share a run of three words (two of them not small words) with
a string in the runner, the roles, the playbooks or the workloads. Placeholders of f-strings are
left out of the code's words, so a quote with real values still matches its template."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = {"the", "of", "a", "an", "is", "not", "to", "in", "on", "and", "or", "for", "be", "by", "no", "at", "as", "it",
         "its", "with", "from", "that", "this", "are", "was", "but", "does", "did", "has", "have", "you", "run", "node"}
QUOTES = (
    re.compile(r"distrun: error: ([^`\n]+)"),
    re.compile(r"^✗ ([^`\n]+)", re.M),
    re.compile(r"^\s*fix: ([^`\n]+)", re.M),
    re.compile(r"(?:refuses|refused|says|prints)[^`\n|]{0,120}\(`([^`]{15,})`\)"),
)


# Texts the code puts together from pieces no four words of which stand together in one string.
COMPOSED = {
    "ports on node1: port 29500 in use by": "judge.py's 'port N ' + the probe's 'in use ' + 'by NAME (pid N)'",
}


def _words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z]{2,}", text)]


def _code_words() -> str:
    texts = []
    for folder in ("runner/distrun", "roles", "playbooks", "workloads"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yml", ".j2", ".sh"):
                texts.append(re.sub(r"\{[^{}\n]*\}", " ", path.read_text(errors="replace")))
    return " " + " ".join(_words(" ".join(texts))) + " "


def quoted_errors() -> list[tuple[str, str]]:
    found = []
    for doc in sorted([*(REPO / "docs" / "guide").glob("*.md"), REPO / "README.md"]):
        text = doc.read_text()
        for pattern in QUOTES:
            found += [(doc.name, m.group(1)) for m in pattern.finditer(text)]
    return found


def in_code(quote: str, code: str) -> bool:
    words = _words(quote)
    windows = [words[i:i + 3] for i in range(len(words) - 2)]
    return any(len([x for x in w if x not in SMALL]) >= 2 and f" {' '.join(w)} " in code for w in windows)


def test_every_error_text_the_docs_quote_is_printed_by_the_code():
    code = _code_words()
    quotes = quoted_errors()
    assert len(quotes) >= 10, "the docs' error quotes are no longer found"
    missing = [f"{doc}: {q[:120]}" for doc, q in quotes
               if len(_words(q)) >= 3 and not in_code(q, code) and not any(q.startswith(a) for a in COMPOSED)]
    assert not missing, "quoted in the docs, printed by no code:\n" + "\n".join(missing)


def test_a_quote_no_code_prints_is_caught():
    assert not in_code("the partition does not match the number of MPI ranks", _code_words())
