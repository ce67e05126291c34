"""The files an inventory is made of, as Ansible reads them, and what Ansible would read in them
without a word, checked before it is asked: the file list (symlinked folders followed, as
Ansible follows them), a text that is not UTF-8 (a byte-order mark before an INI header, UTF-16,
Latin-1: the encoding and the line named), a YAML key given twice in one mapping (a key that
overrides one a merge key ``<<`` brought in is YAML's own way to override, and stays), and a
host given one variable twice with two values in one file (two groups' lines: Ansible keeps
one). Ansible stays the reader: these checks only refuse what it would take silently or tell
in other words.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml

from distrun.errors import InventoryError

MAX_FILES = 2000
# Files Ansible's YAML plugin (or the vars plugin, in group_vars/ and host_vars/) reads.
YAML_SUFFIXES = (".yml", ".yaml", ".json")


def files(path: Path) -> list[Path] | None:
    """Every file Ansible reads for this inventory, or None when it has more than MAX_FILES. A
    file inventory also reads group_vars/ and host_vars/ beside it. Symlinked folders are
    followed (group_vars/all -> a folder shared by several inventories), each real folder once."""
    roots = [path] if path.is_dir() else [path, path.parent / "group_vars", path.parent / "host_vars"]
    found: list[Path] = []
    seen: set[str] = set()
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
                real = os.path.realpath(dirpath)
                if real in seen:  # a link back up the tree: walked once
                    dirnames[:] = []
                    continue
                seen.add(real)
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                found += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
        if len(found) > MAX_FILES:
            return None
    return found


def is_script(path: Path) -> bool:
    """An executable inventory file: Ansible runs it (its script plugin) instead of reading it."""
    try:
        return path.is_file() and os.access(path, os.X_OK)
    except OSError:
        return False


def _is_vars_file(path: Path) -> bool:
    return any(part in ("group_vars", "host_vars") for part in path.parts[:-1])


def _read_as_yaml(path: Path) -> bool:
    return _is_vars_file(path) or path.suffix.lower() in YAML_SUFFIXES


def check(inventory: Path, paths: list[Path]) -> None:
    """Each file's encoding, then its YAML keys and its hosts' variables (see the module doc)."""
    for f in paths:
        if is_script(f) and not _is_vars_file(f):
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue  # Ansible's own message says why it cannot be read
        text = _decoded(inventory, f, data)
        if text is None or "$ANSIBLE_VAULT" in text:
            continue
        if _read_as_yaml(f):
            _check_yaml(inventory, f, text)
        else:
            _check_ini(inventory, f, text)


def _decoded(inventory: Path, f: Path, data: bytes) -> str | None:
    where = f"inventory {inventory}: {f}" if f != inventory else f"inventory {inventory}"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(data) > 1 and b"\x00" in data[:200]):
        raise InventoryError(f"{where} is UTF-16 text (a Windows editor's 'Unicode'); Ansible reads UTF-8 only: save "
                             f"it as UTF-8 (iconv -f UTF-16 -t UTF-8 {f} > {f.name}.utf8, then move it back)")
    if data.startswith(b"\xef\xbb\xbf") and not _read_as_yaml(f):
        raise InventoryError(f"{where} starts with a UTF-8 byte-order mark (BOM), which Ansible's INI reader takes as "
                             "part of line 1; save it as UTF-8 without a BOM (sed -i '1s/^\\xEF\\xBB\\xBF//' FILE)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InventoryError(f"{where}: line {line} is not UTF-8 (byte 0x{data[exc.start]:02x} at column {column}: "
                             f"Latin-1 or Windows-1252 text?); Ansible reads UTF-8 only: save it as UTF-8 "
                             f"(iconv -f LATIN1 -t UTF-8 {f})") from None


# --- YAML: keys given twice, a host's variable with two values ------------------------------------

_MERGE = "tag:yaml.org,2002:merge"


def _check_yaml(inventory: Path, f: Path, text: str) -> None:
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return  # not YAML Ansible can read: its own message says where
    for doc in documents:
        for node in _mappings(doc):
            keys: dict[str, yaml.Node] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE:
                    continue
                if key.value in keys:
                    mark = key.start_mark
                    raise InventoryError(
                        f"inventory {inventory}: duplicate mapping key {key.value!r} at {f}:{mark.line + 1}:"
                        f"{mark.column + 1} (first at line {keys[key.value].start_mark.line + 1}; YAML would keep the "
                        "last without a word); give each key once (keep one of the two, or merge them)")
                keys[key.value] = key
    if not _is_vars_file(f) and documents and isinstance(documents[0], yaml.MappingNode):
        _conflicts(inventory, f, _yaml_host_vars(documents[0]))


def _mappings(node: yaml.Node | None) -> Iterator[yaml.MappingNode]:
    stack = [node]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            yield n
            stack += [v for pair in n.value for v in pair]
        elif isinstance(n, yaml.SequenceNode):
            stack += n.value


def _items(node: yaml.Node) -> Iterator[tuple[str, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE:
                yield key.value, value


def _yaml_host_vars(root: yaml.MappingNode) -> Iterator[tuple[str, str, str, str, int]]:
    """(host, variable, value, group, line) of every scalar host variable the YAML inventory
    sets (all: {children: {g: {hosts: {h: {k: v}}}}})."""
    stack: list[tuple[str, yaml.Node]] = list(_items(root))
    seen: set[int] = set()
    while stack:
        group, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for part, value in _items(node):
            if part == "hosts":
                for host, hv in _items(value):
                    for key, v in _items(hv):
                        if isinstance(v, yaml.ScalarNode):
                            yield host, key, v.value, group, v.start_mark.line + 1
            elif part == "children":
                stack += list(_items(value))


# --- INI: a host's variable with two values ---------------------------------------------------------

_SECTION = re.compile(r"^\[([^\]:]+)(?::(\w+))?\]\s*$")


def _check_ini(inventory: Path, f: Path, text: str) -> None:
    _conflicts(inventory, f, _ini_host_vars(text))


def _ini_host_vars(text: str) -> Iterator[tuple[str, str, str, str, int]]:
    group, kind = "ungrouped", ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith((";", "#")):
            continue
        m = _SECTION.match(stripped)
        if m:
            group, kind = m.group(1), m.group(2) or ""
            continue
        if kind:  # :vars, :children
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError:
            return  # Ansible's message says what is wrong with the line
        if not words or "[" in words[0]:
            continue  # a host range (w[1:4]): its hosts are Ansible's to expand
        host = words[0].rsplit(":", 1)[0] if words[0].count(":") == 1 else words[0]
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if eq:
                yield host, key, value, group, number


def _conflicts(inventory: Path, f: Path, found: Iterator[tuple[str, str, str, str, int]]) -> None:
    first: dict[tuple[str, str], tuple[str, str, int]] = {}
    for host, key, value, group, line in sorted(found, key=lambda item: item[4]):
        earlier = first.setdefault((host, key), (value, group, line))
        if earlier[0] != value:
            raise InventoryError(
                f"inventory {inventory}: host {host} has {key} given twice with two values in {f}: {earlier[0]!r} "
                f"(line {earlier[2]}, group {earlier[1]}) and {value!r} (line {line}, group {group}); Ansible keeps "
                f"one without a word: set {key} once, on one line of {host}")
