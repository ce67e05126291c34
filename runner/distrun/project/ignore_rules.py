"""Git's ignore-file format (``.gitignore``, ``.distrunignore``): one line -> one rule, and
the rule as a regular expression, so a project folder is sent as git would commit it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class IgnoreRule:
    """One line of an ignore file, in git's meaning."""

    base: str  # folder of the ignore file, relative to the workdir ('' at the top)
    pattern: str  # without '!', a leading '/' and a trailing '/'
    negate: bool  # '!pattern': include again
    dir_only: bool  # 'pattern/': folders only
    anchored: bool  # a '/' in it: matched against the path below base, else against the name

    def _regex(self) -> re.Pattern[str]:
        return re.compile(_glob_regex(self.pattern if self.anchored else re.sub(r"\*+", "*", self.pattern)))

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not path.startswith(self.base + "/"):
                return False
            path = path[len(self.base) + 1:]
        subject = path if self.anchored else path.rsplit("/", 1)[-1]
        return self._regex().fullmatch(subject) is not None

    def rsync_rules(self) -> list[str]:
        """The same rule as rsync filter rules (rsync: the first matching rule decides)."""
        sign = "+" if self.negate else "-"
        tail = "/" if self.dir_only else ""
        prefix = f"/{self.base}/" if self.base else "/"
        if self.anchored:
            return [f"{sign} {prefix}{f}{tail}" for f in dict.fromkeys(_zero_folder_forms(self.pattern))]
        name = re.sub(r"\*+", "*", self.pattern)
        if not self.base:
            return [f"{sign} {name}{tail}"]  # a bare name: rsync matches it at any depth, as git does
        return [f"{sign} {prefix}**/{name}{tail}", f"{sign} {prefix}{name}{tail}"]


def _zero_folder_forms(pattern: str, start: int = 0) -> list[str]:
    """git's '**/' also matches no folder at all, rsync's needs one: every form with and without it."""
    i = pattern.find("**/", start)
    if i == -1:
        return [pattern]
    if i == 0 or pattern[i - 1] == "/":
        return _zero_folder_forms(pattern, i + 3) + _zero_folder_forms(pattern[:i] + pattern[i + 3:], i)
    return _zero_folder_forms(pattern, i + 3)


def _normalize(pattern: str) -> str:
    """git reads '**' as 'any folders' only as a whole path segment; elsewhere it is '*'."""
    def one(m: re.Match[str]) -> str:
        whole = (m.start() == 0 or pattern[m.start() - 1] == "/") and (m.end() == len(pattern) or pattern[m.end()] == "/")
        return "**" if whole else "*"
    return re.sub(r"\*{2,}", one, pattern)


def _glob_regex(pattern: str) -> str:
    """git's wildmatch as a regular expression: '*' and '?' stay in one folder, '**/' spans folders."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern[i] == "*":
            while i < len(pattern) and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2)
            if end == -1:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse_ignore(text: str, base: str = "") -> list[IgnoreRule]:
    """The rules of one ignore file found in ``base``, in file order (git's gitignore format)."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith(("\\!", "\\#")):
            line = line[1:]
        if line.endswith("\\ "):
            line = line[:-2] + " "
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        rules.append(IgnoreRule(base, _normalize(line.lstrip("/")), negate, dir_only, anchored))
    return rules
