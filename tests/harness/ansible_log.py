"""Read an Ansible (or molecule) log the way a person would: which task failed, on which host, and why."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TASK = re.compile(r"^\s*(?:[│|]\s*)?TASK \[(.+?)\]")
_FAILED = re.compile(r"^\s*(?:[│|]\s*)?(fatal|failed): \[([^\]]+)\]")


def failed_tasks(text: str, limit: int = 12, context: int = 6) -> str:
    """Each failed task of the log with the lines Ansible printed for it; '' when none failed.

    A failing step's own lines are what explains it; the last kilobytes of a long log are
    usually the teardown that followed."""
    lines = _ANSI.sub("", text).splitlines()
    task = "?"
    found: list[str] = []
    for i, line in enumerate(lines):
        m = _TASK.match(line)
        if m:
            task = m[1]
            continue
        m = _FAILED.match(line)
        if not m:
            continue
        block = [line]
        for nxt in lines[i + 1:i + context]:
            if _TASK.match(nxt) or nxt.lstrip(" │|").startswith(("PLAY ", "RUNNING HANDLER")):
                break
            block.append(nxt)
        if not any("...ignoring" in b for b in block):
            found.append(f"task [{task}] {m[1]} on {m[2]}:\n" + "\n".join(block))
            if len(found) == limit:
                break
    return "\n".join(found)
