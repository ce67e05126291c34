"""The run's variables that a ``--workdir`` command and a ``--prepare`` step may name, such as
``{np}``: one list, documented in docs/guide/your-own-project.md.

Substitution works on words that were already split (shlex), never on shell text, so a value
can never become a second word or a shell command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from distrun.errors import PlanError

# name -> what it holds (the guide's table is checked against this).
VARIABLES: Mapping[str, str] = {
    "np": "the number of ranks (the world size)",
    "nodes": "the number of hosts that run ranks",
    "hosts": "those hosts' inventory names, comma-separated, in rank order",
    "head": "the head node's inventory name (where --prepare runs)",
    "run_id": "the run's id",
    "run_dir": "the run's directory on the nodes (its logs; collected after the run)",
    "workdir": "the project folder on the nodes (the working directory of the ranks and of --prepare)",
    "shared_dir": "the shared folder, distrun_shared_dir",
}

def run_values(*, np: int, hosts: Sequence[str], head: str, run_id: str, run_dir: str, workdir: str | None,
               shared_dir: str) -> dict[str, str]:
    """Each variable's value for one run."""
    return {"np": str(np), "nodes": str(len(hosts)), "hosts": ",".join(hosts), "head": head, "run_id": run_id,
            "run_dir": run_dir, "workdir": workdir or "", "shared_dir": shared_dir.rstrip("/")}


_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STRICT = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(words: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """The command after ``--``: each ``{name}`` of the list is replaced; everything else,
    unknown names and braces included, is passed exactly as written."""
    return tuple(_NAME.sub(lambda m: values.get(m.group(1), m.group(0)), w) for w in words)


def substitute_strict(words: Sequence[str], values: Mapping[str, str], flag: str) -> tuple[str, ...]:
    """``--prepare``: like substitute, but an unknown ``{name}`` is refused (a typo would reach
    the script as text), and ``{{`` / ``}}`` stand for a literal brace."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        name = m.group(1)
        if name not in values:
            known = ", ".join(f"{{{k}}}" for k in VARIABLES)
            raise PlanError(f"{flag}: unknown variable {{{name}}}; known: {known} (write {{{{ and }}}} for a literal brace)")
        return values[name]

    return tuple(_STRICT.sub(one, w) for w in words)


def split_words(text: str | None, flag: str) -> tuple[str, ...]:
    """A flag's text split into words as a shell would split them, without running a shell."""
    if not text:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise PlanError(f"{flag} {text!r}: {exc} (quote words with spaces: '--mca btl ^openib' or \"a b\")") from None
