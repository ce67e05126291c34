"""ansible-playbook as distrun starts it (distrun.ansible_start): what it keeps of Ansible's
start-up parses gives Ansible exactly what parsing would have (values and their tags), a
playbook runs alike with nothing kept, an empty cache and a full one, and a cache folder or file
that is not this user's alone is never read. Each case runs in processes of its own: the parses
are kept per process, the way ansible-playbook runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from distrun.ansible_bridge import ansible_env, playbook_program
from distrun.ansible_start import CACHE_ENV

PROGRAM = str(Path(sys.executable).parent / "distrun-ansible-playbook")

# What Ansible holds after its start-up, in one canonical text: the base configuration's
# definitions, every connection, shell, become, callback and lookup plugin's options it read, and
# the builtin collection's routing table; each value with its type and its tags (a template's
# trust, the file and line it came from).
DUMP = r"""
import json, sys
from distrun.ansible_start import keep_parses
kept = keep_parses()
from ansible import constants as C
from ansible.plugins.loader import become_loader, callback_loader, connection_loader, init_plugin_loader, lookup_loader, shell_loader
init_plugin_loader()
from ansible.module_utils._internal._datatag import AnsibleTagHelper
for loader in (connection_loader, shell_loader, become_loader, callback_loader):
    list(loader.all(class_only=True))
lookup_loader.get("ansible.builtin.file")
import ansible_collections.ansible.builtin as builtin

def canon(value):
    tags = sorted(repr(t) for t in AnsibleTagHelper.tags(value))
    if isinstance(value, dict):
        inner = sorted((canon(k), canon(v)) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        inner = [canon(v) for v in value]
    else:
        inner = repr(value)
    return f"{type(value).__name__}{tags}{inner}"

plugins = C.config._plugins
print(json.dumps({"kept": kept, "plugins": sorted(f"{t}/{n}" for t in plugins for n in plugins[t]),
                  "base": canon(C.config._base_defs), "options": canon(plugins),
                  "routing": canon(builtin._collection_meta)}))
"""


def _dump(cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}
    if cache is not None:
        env[CACHE_ENV] = str(cache)
    out = subprocess.run([sys.executable, "-c", DUMP], capture_output=True, text=True, timeout=120, check=True, env=env)
    return json.loads(out.stdout)


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def test_what_is_kept_is_what_ansible_parses(tmp_path):
    cache = _private(tmp_path / "kept")
    plain = _dump(None)
    first = _dump(cache)  # parses, and keeps
    kept_files = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    second = _dump(cache)  # reads what was kept
    assert not plain["kept"] and first["kept"] and second["kept"]
    assert {n.split("-")[0] for n in kept_files} == {"config", "plugin", "routing"}
    assert sum(n.startswith("plugin-options-") for n in kept_files) >= len(plain["plugins"])
    assert "connection/ssh" in plain["plugins"] and "become/sudo" in plain["plugins"]
    for part in ("plugins", "base", "options", "routing"):
        assert first[part] == plain[part], part
        assert second[part] == plain[part], part
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == kept_files  # nothing parsed again


def test_a_kept_file_that_does_not_load_is_parsed_again_and_replaced(tmp_path):
    cache = _private(tmp_path / "kept")
    plain = _dump(None)
    _dump(cache)
    for path in cache.iterdir():
        path.write_bytes(b"\x00not what was kept")
    assert _dump(cache)["options"] == plain["options"]
    assert all(b"not what was kept" not in p.read_bytes() for p in cache.iterdir())
    assert _dump(cache)["routing"] == plain["routing"]


def test_a_folder_others_may_write_is_never_read_or_written(tmp_path):
    for mode in (0o775, 0o777):  # a group or anyone may write: a file there could be anyone's
        shared = tmp_path / f"shared{mode:o}"
        shared.mkdir()
        shared.chmod(mode)
        assert _dump(shared)["kept"] is False
        assert list(shared.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(_private(tmp_path / "real"))
    assert _dump(link)["kept"] is False


def test_a_kept_file_others_may_write_is_not_loaded(tmp_path):
    cache = _private(tmp_path / "kept")
    plain = _dump(None)
    _dump(cache)
    routing = next(p for p in cache.iterdir() if p.name.startswith("routing-") and p.stat().st_size > 1000)
    routing.write_bytes(b"\x00planted")
    routing.chmod(0o666)
    assert _dump(cache)["routing"] == plain["routing"]  # parsed, not loaded from the planted file


PLAYBOOK = """
- name: Show what the options and the routing give
  hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - name: Read plugin options and a routed module
      ansible.builtin.debug:
        msg: "remote_tmp={{ lookup('ansible.builtin.config', 'remote_tmp', plugin_type='shell', plugin_name='sh') }}
              timeout={{ lookup('ansible.builtin.config', 'timeout', plugin_type='connection', plugin_name='ssh') }}"
    - name: A module named by a name the routing table redirects
      ansible.builtin.command: echo routed
      changed_when: false
      register: routed
    - name: Say it
      ansible.builtin.debug:
        msg: "{{ routed.stdout }}"
    - name: Templates of every kind, rendered from kept code the second time
      ansible.builtin.debug:
        msg: >-
          {%- set names = ['node_a', 'node_b'] -%}
          {{ names | map('upper') | select('match', '^NODE') | list }}
          {{ 'c:\\new' }} {{ 'x_name' | regex_replace('^(.*)_name$', '\\1') }}
          {{ {'b': 2, 'a': 1} | dict2items | map(attribute='key') | sort | join(',') }}
          {{ (range(3) | sum) is divisibleby 3 }} {{ [1, 2] | twice }} {{ lookup('ansible.builtin.env', 'HOME') | length > 0 }}
          {{ undefined_thing | default('fallback') }} {{ 'x' if names is sequence else 'y' }}
    - name: A conditional, compiled as an expression
      ansible.builtin.debug:
        msg: "when holds"
      when: (['a'] | twice | length) == 2 and 'a' is string
"""

# A filter plugin of the playbook's: plain the first time, then given its context (Jinja's code
# passes it one argument more): code kept for the first must not be used for the second.
FILTER = """
from jinja2 import pass_context


class FilterModule:
    def filters(self):
        return {"twice": twice}

"""
PLAIN = FILTER + "def twice(value):\n    return list(value) * 2\n"
WITH_CONTEXT = FILTER + "@pass_context\ndef twice(context, value):\n    return list(value) * 2\n"


def _play(tmp_path: Path, cache: str | None) -> str:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    env.pop(CACHE_ENV, None)
    if cache is not None:
        env[CACHE_ENV] = cache
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    if not (tmp_path / "filter_plugins").exists():
        (tmp_path / "filter_plugins").mkdir()
        (tmp_path / "filter_plugins" / "twice.py").write_text(PLAIN)
    out = subprocess.run([PROGRAM, str(book)], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return "\n".join(line for line in out.stdout.splitlines() if '"msg"' in line)


def test_a_playbook_runs_alike_with_nothing_kept_an_empty_cache_and_a_full_one(tmp_path):
    cache = _private(tmp_path / "kept")
    plain = _play(tmp_path, None)
    assert "remote_tmp=~/.ansible/tmp" in plain and "timeout=" in plain and "routed" in plain
    assert "['NODE_A', 'NODE_B']" in plain and "c:\\\\new x" in plain and "a,b True [1, 2, 1, 2] True" in plain
    assert "fallback x" in plain and "when holds" in plain
    assert _play(tmp_path, str(cache)) == plain
    assert len([p for p in cache.iterdir() if p.name.startswith("template-")]) >= 4
    assert _play(tmp_path, str(cache)) == plain
    assert _play(tmp_path, "") == plain  # an empty DISTRUN_ANSIBLE_CACHE keeps nothing


def test_kept_code_is_not_used_when_a_filter_it_names_changed(tmp_path):
    cache = _private(tmp_path / "kept")
    plain = _play(tmp_path, str(cache))
    (tmp_path / "filter_plugins" / "twice.py").write_text(WITH_CONTEXT)
    assert _play(tmp_path, str(cache)) == plain  # compiled anew: the filter now takes its context
    assert _play(tmp_path, None) == plain


def test_runs_start_ansible_playbook_through_it_with_a_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert playbook_program() == PROGRAM
    cache = Path(ansible_env()[CACHE_ENV])
    assert cache.parent == tmp_path / "home" and cache.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv(CACHE_ENV, "")
    assert ansible_env()[CACHE_ENV] == ""  # a user's own setting wins: empty keeps nothing


def test_the_routing_is_kept_under_the_digest_of_its_bytes(tmp_path):
    cache = _private(tmp_path / "kept")
    _dump(cache)
    import ansible

    table = Path(ansible.__file__).parent / "config" / "ansible_builtin_runtime.yml"
    assert (cache / f"routing-{hashlib.sha256(table.read_bytes()).hexdigest()}.marshal").is_file()


BROKEN = """
- name: A template Jinja cannot compile
  hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - name: Name a filter nobody has
      ansible.builtin.debug:
        msg: "{{ [1] | no_such_filter }}"
"""


def test_a_template_that_does_not_compile_fails_alike_and_is_not_kept(tmp_path):
    cache = _private(tmp_path / "kept")
    book = tmp_path / "broken.yml"
    book.write_text(BROKEN)
    said = []
    for where in (None, str(cache), str(cache)):
        env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}
        env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"})
        if where is not None:
            env[CACHE_ENV] = where
        out = subprocess.run([PROGRAM, str(book)], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=tmp_path)
        assert out.returncode == 2
        said.append([line for line in (out.stdout + out.stderr).splitlines() if "no_such_filter" in line])
    assert said[0] and said[1] == said[0] and said[2] == said[0]
    assert not [p for p in cache.iterdir() if p.name.startswith("template-")]
