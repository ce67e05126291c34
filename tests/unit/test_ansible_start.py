"""ansible-playbook as distrun starts it (distrun.transport.ansible_start) is Ansible's own program run as
it is: a playbook gives the same output through it as through ansible-playbook, and no module of
the runner or plugin of the roles reaches into a private part of Ansible (a module or attribute
whose name starts with an underscore), so an ansible-core upgrade needs no re-check of its insides."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from distrun.transport.ansible_bridge import ansible_env, playbook_program

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROGRAM = str(BIN / "distrun-ansible-playbook")

PLAYBOOK = """
- name: Templates, filters and a conditional
  hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - name: Render
      ansible.builtin.debug:
        msg: "{{ {'b': 2, 'a': 1} | dict2items | map(attribute='key') | sort | join(',') }} {{ undefined_thing | default('fallback') }}"
      when: (['a'] | length) == 1
"""


def _run(program: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    return subprocess.run([program, str(book)], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=tmp_path)


def test_a_playbook_runs_through_it_as_through_ansible_playbook(tmp_path):
    ours, theirs = _run(PROGRAM, tmp_path), _run(str(BIN / "ansible-playbook"), tmp_path)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    assert '"msg": "a,b fallback"' in ours.stdout
    assert [line for line in ours.stdout.splitlines() if "msg" in line or "ok=" in line] == \
        [line for line in theirs.stdout.splitlines() if "msg" in line or "ok=" in line]


def test_runs_start_it_and_pass_no_setting_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    assert playbook_program() == PROGRAM
    assert not [k for k in ansible_env() if k.startswith("DISTRUN_")]


def test_an_early_playbook_given_no_arguments_runs_nothing(tmp_path):
    out = subprocess.run([PROGRAM, "--distrun-args-from", str(tmp_path / "nobody-listens.sock")],
                         capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert out.returncode == 90
    assert "distrun gave this playbook no arguments; nothing was run" in out.stderr


# A dotted name with a part that starts with one underscore (not a dunder): ansible._internal,
# ansible.utils.collection_loader._collection_finder, ConfigManager._read_config_yaml_file, ...
_PRIVATE = re.compile(r"^_(?!_)")


def _private_uses(path: Path) -> list[str]:
    """Each import of a private part of ansible (or ansible_collections.ansible.builtin) and each
    private attribute read off a name bound to something imported from ansible, in one file."""
    tree = ast.parse(path.read_text(), str(path))
    from_ansible: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ansible":
                    from_ansible.add((alias.asname or alias.name).split(".")[0])
                    if any(_PRIVATE.match(p) for p in alias.name.split(".")):
                        found.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ansible":
            for alias in node.names:
                from_ansible.add(alias.asname or alias.name)
            names = node.module.split(".") + [a.name for a in node.names]
            if any(_PRIVATE.match(p) for p in names):
                found.append(f"{path}:{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _PRIVATE.match(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in from_ansible:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "import_module", "__import__"):
            text = ast.unparse(node)
            if re.search(r"""['"](ansible[\w.]*\._|_)(?!_)\w*['"]""", text) and ("ansible" in text or any(n in text for n in from_ansible)):
                found.append(f"{path}:{node.lineno}: {text}")
    return found


def _sources() -> list[Path]:
    return sorted([*(ROOT / "runner").rglob("*.py"), *(ROOT / "roles").glob("*/*_plugins/*.py"),
                   *(ROOT / "roles").glob("*/library/*.py"), *(ROOT / "roles").glob("*/module_utils/*.py")])


def test_no_private_part_of_ansible_is_used():
    sources = _sources()
    assert ROOT / "runner" / "distrun" / "transport" / "ansible_start.py" in sources and len(sources) > 40
    found = [use for path in sources for use in _private_uses(path)]
    assert not found, "private Ansible used (use a public interface):\n" + "\n".join(found)


def test_the_guard_finds_private_uses(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import ansible._internal._templating as t\n"
                      "from ansible.utils.collection_loader import _collection_finder\n"
                      "from ansible.config.manager import ConfigManager\n"
                      "ConfigManager._read_config_yaml_file = None\n"
                      "from ansible.plugins.loader import PluginLoader as PL\n"
                      "x = PL._load_config_defs\n"
                      "import ansible.cli\n"
                      "y = ansible.cli.playbook\n"
                      "z = getattr(ConfigManager, '_read_config_yaml_file')\n"
                      "class Mine:\n    def _own(self): return self._own\n")
    found = _private_uses(sample)
    assert sorted(int(line.split(":")[1]) for line in found) == [1, 2, 4, 6, 9], found
