"""ansible-playbook as distrun starts it: Ansible's own program, with the work it repeats at every
start and in every worker kept by digest.

Before its first task, every ansible-playbook parses YAML that ships with Ansible and never
changes between runs: the routing table of the builtin collection (370 KB, read the first time a
task or plugin is named by its full name, which ansible-lint asks of every task), the base
configuration's definitions and the DOCUMENTATION of each plugin it loads (connection, shell,
become, callback, inventory, cache, lookup, ...: their options). Then each worker process (one
per task and host) compiles every Jinja template it renders, anew. On these machines that is
about 0.2 s of every run's start and a tenth of a second of each preflight probe, on the run's
critical path. This entry point keeps the results in distrun's private state folder
(DISTRUN_ANSIBLE_CACHE, made 0700 by the runner) and then runs ansible-playbook's own ``main``.
What is kept is keyed by content: the routing table and the definitions by the digest of the
bytes parsed, plugin options by the digest of the installed ansible-core's RECORD (the digest
of each of its files) and of the plugin's DOCUMENTATION, a template's code by the digest of its
source and of the settings Jinja compiles it with (the filters and tests it names are looked up
again before it is used). Anything else, or anything unusual (no cache folder, one another user
could write, a kept file that does not load), is done as Ansible always does it: the cache only
ever saves time.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import sys
from collections.abc import Callable
from typing import Any

# pickle and tempfile are imported where they are used: the runner imports this module for
# CACHE_ENV alone, on every verb's start.
CACHE_ENV = "DISTRUN_ANSIBLE_CACHE"
# ``--distrun-args-from SOCKET`` (the first two arguments): the program starts, imports Ansible, and
# only then takes the rest of its arguments from the runner, over that Unix socket (in the run's
# private folder), so the runner can start it while it still plans the run (distrun.ansible_bridge
# .EarlyPlaybook). A socket that closes without a well-formed answer runs nothing.
ARGS_FROM = "--distrun-args-from"
# Its exit status when the runner gave no arguments (it stopped, or ran another playbook first).
NO_ARGUMENTS = 90


class Kept:
    """Files in one private folder, each written whole (a temporary file renamed over it)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    @classmethod
    def at(cls, folder: str | None) -> Kept | None:
        """A folder of this user's that nobody else may write (what it holds is loaded), else None."""
        if not folder:
            return None
        try:
            st = os.lstat(folder)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return None
        return cls(folder)

    def read(self, name: str) -> bytes | None:
        try:
            fd = os.open(os.path.join(self.folder, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            with os.fdopen(fd, "rb", closefd=False) as fh:
                return fh.read()
        except OSError:
            return None
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes) -> None:
        import tempfile

        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{name}.")
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, os.path.join(self.folder, name))
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def parsed(self, kind: str, raw: bytes, parse: Callable[[], Any]) -> Any:
        """``parse()``'s answer for these bytes, a mapping: kept (marshal: plain data only) under
        their digest."""
        name = f"{kind}-{hashlib.sha256(raw).hexdigest()}.marshal"
        data = self.read(name)
        if data is not None:
            try:
                value = marshal.loads(data)
                if isinstance(value, dict):
                    return value
            except (EOFError, ValueError, TypeError):
                pass
        value = parse()
        try:
            self.write(name, marshal.dumps(value))
        except ValueError:  # not plain data: parsed every time
            pass
        return value


def _keep_routing(kept: Kept) -> None:
    """The routing tables of ansible.builtin and of collections (their meta/runtime.yml): the
    collection loader's parser is a module-level function for tools to replace, with a content
    id for caching; the tables are plain strings, lists and mappings (a base loader's)."""
    from ansible.utils.collection_loader import _collection_finder

    parse = _collection_finder._meta_yml_to_dict
    if parse is None:
        return

    def routing(data: bytes | str, content_id: Any) -> Any:
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")
        return kept.parsed("routing", raw, lambda: parse(data, content_id))

    _collection_finder._meta_yml_to_dict = routing


def _keep_base_definitions(kept: Kept) -> None:
    """The base configuration's definitions (base.yml, parsed by the config manager when
    ansible.constants is first imported: this runs before that import)."""
    from ansible.config.manager import ConfigManager

    read = ConfigManager._read_config_yaml_file

    def definitions(self: Any, yml_file: Any) -> Any:
        path = os.fsencode(yml_file)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            return read(self, yml_file)  # Ansible's own error
        return kept.parsed("config-definitions", raw, lambda: read(self, yml_file))

    ConfigManager._read_config_yaml_file = definitions


def _ansible_record() -> tuple[str, str] | None:
    """The installed ansible-core's package folder and the digest of its RECORD (which lists
    each installed file with its own digest); None where there is none (a source checkout)."""
    import ansible

    package = os.path.dirname(os.path.abspath(ansible.__file__))
    site = os.path.dirname(package)
    try:
        infos = sorted(n for n in os.listdir(site) if n.startswith("ansible_core-") and n.endswith(".dist-info"))
    except OSError:
        return None
    if len(infos) != 1:
        return None
    try:
        with open(os.path.join(site, infos[0], "RECORD"), "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None
    return package + os.sep, digest


class PluginOptions:
    """Each plugin's option definitions as Ansible read them (tagged values, so pickle), one file
    per plugin and documentation, named by the digest of both: a worker process that loads a
    plugin first keeps it once, and none rewrites another's. Kept for the installed ansible-core's
    own plugins (whose doc fragments are its own files, under its RECORD's digest) and for any
    plugin whose documentation takes no doc fragments (ansible-runner's event callback, distrun's
    lookup): another collection's fragments could change under the same documentation."""

    def __init__(self, kept: Kept, package: str, digest: str) -> None:
        self.kept, self.package = kept, package
        self.digest = f"{digest} py{sys.version_info[0]}.{sys.version_info[1]}"

    def name(self, type_name: str, name: str, path: Any, module: Any) -> str | None:
        doc = getattr(module, "DOCUMENTATION", "")
        if not isinstance(path, str) or not isinstance(doc, str):
            return None
        if not path.startswith(self.package) and "extends_documentation_fragment" in doc:
            return None
        h = hashlib.sha256(f"{self.digest}\0{type_name}\0{name}\0{path}\0{doc}".encode("utf-8", "surrogateescape"))
        return f"plugin-options-{h.hexdigest()}.pickle"

    def get(self, name: str) -> tuple[bool, Any]:
        import pickle

        data = self.kept.read(name)
        if data is None:
            return False, None
        try:
            value = pickle.loads(data)
        except Exception:  # a kept file that does not load is parsed again and replaced
            return False, None
        if isinstance(value, tuple) and len(value) == 1:
            return True, value[0]
        return False, None

    def put(self, name: str, options: Any) -> None:
        import pickle

        try:
            data = pickle.dumps((options,), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # options that do not pickle: read every time
            return
        self.kept.write(name, data)


def _keep_plugin_options(kept: Kept, record: tuple[str, str]) -> None:
    """A plugin's options are read from its DOCUMENTATION once per process, when the plugin is
    first loaded (PluginLoader._load_config_defs): kept here per plugin."""
    from ansible import constants as C
    from ansible.plugins.loader import PluginLoader, get_plugin_class

    options = PluginOptions(kept, *record)
    load = PluginLoader._load_config_defs

    def config_defs(self: Any, name: str, module: Any, path: Any) -> None:
        if not self.class_name:
            return load(self, name, module, path)
        type_name = str(get_plugin_class(self.class_name))
        if type_name not in C.CONFIGURABLE_PLUGINS or C.config.has_configuration_definition(type_name, name):
            return load(self, name, module, path)
        kept_as = options.name(type_name, name, path, module)
        if kept_as is None:
            return load(self, name, module, path)
        found, defs = options.get(kept_as)
        if found:
            if defs is not None:  # None: its documentation names no options
                C.config.initialize_plugin_configuration_definitions(type_name, name, defs)
            return None
        load(self, name, module, path)
        has = C.config.has_configuration_definition(type_name, name)
        options.put(kept_as, C.config.get_configuration_definitions(type_name, name) if has else None)
        return None

    PluginLoader._load_config_defs = config_defs


class Templates:
    """Jinja's compiled code for each template Ansible renders: every worker process compiles every
    template it renders anew (a task's arguments and the role variables they name, 50 and more for
    the preflight's probe: most of its templating time). Kept here per template: the key is the
    digest of the source and of everything Jinja's code generation reads from the environment
    (its settings, the compile-time backslash escaping, the installed ansible-core and Jinja); the
    filters and tests the template names are looked up again before the code is used (the code
    depends on whether each exists and what it is passed), and any difference compiles anew."""

    def __init__(self, kept: Kept, digest: str) -> None:
        import jinja2

        self.kept = kept
        self.salt = f"{digest}\0{jinja2.__version__}\0{sys.implementation.cache_tag}"

    def name(self, parts: tuple[Any, ...]) -> str:
        h = hashlib.sha256(self.salt.encode())
        for part in parts:
            h.update(b"\0" + repr(part).encode("utf-8", "surrogateescape"))
        return f"template-{h.hexdigest()}.marshal"

    def get(self, name: str, current: Callable[[str, str], Any]) -> Any:
        data = self.kept.read(name)
        if data is None:
            return None
        try:
            code, uses = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            return None
        if not isinstance(uses, tuple) or any(current(kind, plugin) != seen for kind, plugin, seen in uses):
            return None
        return code

    def put(self, name: str, code: Any, uses: tuple[tuple[str, str, Any], ...]) -> None:
        try:
            self.kept.write(name, marshal.dumps((code, uses)))
        except ValueError:
            pass


def _keep_templates(kept: Kept, record: tuple[str, str]) -> None:
    """AnsibleEnvironment.compile, for template sources and for the expressions of conditionals
    (compile_expression parses those itself, then compiles their tree: kept by their source)."""
    import contextvars

    from ansible._internal._templating._jinja_bits import (
        _TEMPLATE_OVERRIDE_FIELD_NAMES,
        AnsibleEnvironment,
        _TemplateCompileContext,
    )
    from ansible._internal._templating._jinja_common import _TemplateConfig
    from jinja2 import nodes
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.utils import _PassArg

    templates = Templates(kept, record[1])
    compile_code = AnsibleEnvironment.compile
    compile_expression = AnsibleEnvironment.compile_expression
    expression: contextvars.ContextVar[str | None] = contextvars.ContextVar("distrun_expression", default=None)

    def settings(env: Any) -> tuple[Any, ...] | None:
        """What Jinja's lexer, parser and code generator read from this environment; None where a
        setting is not plain data (a callable autoescape, template debugging): not kept."""
        if env._debuggable_template_source or not isinstance(env.autoescape, bool):
            return None
        context = _TemplateCompileContext.current(optional=True)
        finalize = env.finalize
        return (type(env).__module__, type(env).__qualname__, env.code_generator_class.__qualname__,
                tuple(getattr(env, n) for n in _TEMPLATE_OVERRIDE_FIELD_NAMES), env.trim_blocks, env.lstrip_blocks,
                env.newline_sequence, env.keep_trailing_newline, env.optimized, env.autoescape, env.is_async,
                env.sandboxed, sorted(getattr(env, "intercepted_binops", ())), sorted(getattr(env, "intercepted_unops", ())),
                sorted(env.extensions), getattr(finalize, "__qualname__", repr(finalize)), str(_PassArg.from_obj(finalize)),
                getattr(env.undefined, "__qualname__", repr(env.undefined)), _TemplateConfig.allow_embedded_templates,
                bool(context and context.escape_backslashes))

    def plugin_of(env: Any) -> Callable[[str, str], Any]:
        def current(kind: str, plugin: str) -> Any:
            try:
                func = (env.filters if kind == "filter" else env.tests).get(plugin)
            except Exception:  # a plugin that does not load: compiled as always, which says so
                return ("error",)
            return None if func is None else str(_PassArg.from_obj(func))
        return current

    def uses_of(tree: Any, current: Callable[[str, str], Any]) -> tuple[tuple[str, str, Any], ...]:
        found = {("filter", n.name) for n in tree.find_all(nodes.Filter)} | {("test", n.name) for n in tree.find_all(nodes.Test)}
        return tuple((kind, plugin, current(kind, plugin)) for kind, plugin in sorted(found))

    def kept_compile(self: Any, source: Any, name: str | None = None, filename: str | None = None,
                     raw: bool = False, defer_init: bool = False) -> Any:
        text = source
        if isinstance(source, nodes.Template):  # compile_expression's tree: kept by its source, used once
            text = expression.get()
            expression.set(None)
        elif not isinstance(source, str):
            text = None
        env = None if raw or text is None else settings(self)
        if env is None:
            return compile_code(self, source, name, filename, raw, defer_init)
        kind = "template" if isinstance(source, str) else "expression"
        kept_as = templates.name((kind, text, name, filename, defer_init, env))
        current = plugin_of(self)
        code = templates.get(kept_as, current)
        if code is not None:
            return code
        if isinstance(source, str):
            try:
                tree = self._parse(source, name, filename)
                code = compile_code(self, tree, name, filename, raw, defer_init)
            except TemplateSyntaxError:
                tree = None
            if tree is None:  # Jinja's own error, told with the template's source (and not chained to ours)
                return compile_code(self, source, name, filename, raw, defer_init)
        else:
            tree = source
            code = compile_code(self, tree, name, filename, raw, defer_init)
        uses = uses_of(tree, current)
        if all(seen != ("error",) for _kind, _plugin, seen in uses):
            templates.put(kept_as, code, uses)
        return code

    def kept_expression(self: Any, source: str, *args: Any, **kwargs: Any) -> Any:
        token = expression.set(source if isinstance(source, str) and not args[1:] and not kwargs else None)
        try:
            return compile_expression(self, source, *args, **kwargs)
        finally:
            expression.reset(token)

    AnsibleEnvironment.compile = kept_compile
    AnsibleEnvironment.compile_expression = kept_expression


def keep_parses() -> bool:
    """Import ansible.cli with its start-up parses kept where DISTRUN_ANSIBLE_CACHE names a
    private folder; False where nothing is kept. The base definitions are read while ansible.cli
    is imported (which first sets up the locale), so that reader is replaced before the import and
    the plugins' after it; an ansible-core whose insides moved is simply run as it is."""
    kept = Kept.at(os.environ.get(CACHE_ENV))
    if kept is not None:
        try:
            _keep_base_definitions(kept)
            _keep_routing(kept)
        except (ImportError, AttributeError):
            kept = None
    import ansible.cli  # noqa: F401  (reads the configuration)

    if kept is None:
        return False
    record = _ansible_record()  # both keys below start from the installed ansible-core's digest
    if record is not None:
        for keep in (_keep_plugin_options, _keep_templates):
            try:
                keep(kept, record)
            except (ImportError, AttributeError):
                pass
    return True


def unix_address(path: str) -> tuple[str, int]:
    """An address for the Unix socket at ``path`` that fits in the 108 bytes a socket address
    holds, however long the folder's path: the folder, opened, named through /proc/self/fd. The
    caller closes the descriptor (the second value) once the socket is bound or connected."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def late_arguments(where: str) -> list[str] | None:
    """The arguments the runner sends over the Unix socket ``where``: a JSON object whose "args"
    is a list of strings, then the end of the stream. None when the connection fails or closes
    with anything else (the runner stopped, or gave up on this process)."""
    import json
    import socket

    chunks: list[bytes] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            address, fd = unix_address(where)
            try:
                conn.connect(address)
            finally:
                os.close(fd)
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        said = json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None
    args = said.get("args") if isinstance(said, dict) else None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return None
    return args


def main() -> Any:
    where = None
    if len(sys.argv) > 2 and sys.argv[1] == ARGS_FROM:
        where = sys.argv[2]
        del sys.argv[1:3]
    keep_parses()
    from ansible.cli.playbook import main as playbook

    if where is not None:
        late = late_arguments(where)
        if late is None:
            sys.stderr.write("distrun-ansible-playbook: distrun gave this playbook no arguments; nothing was run\n")
            return NO_ARGUMENTS
        sys.argv.extend(late)
    sys.argv[0] = os.path.join(os.path.dirname(sys.argv[0]), "ansible-playbook")
    return playbook()


if __name__ == "__main__":
    sys.exit(main())
