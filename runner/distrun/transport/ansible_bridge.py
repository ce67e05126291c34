"""Run distrun's playbooks through ansible-runner: its environment, program and fact cache, the
record it keeps scrubbed, signals while it runs; its events read as host progress (playbook_events).

Each call gets a private data directory inside the run directory (0700): ansible-runner records
the full environment in ``artifacts/<id>/command``, so nothing secret is passed as extravars and
the directory is readable by its owner only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distrun import paths, terminating
from distrun.inventory import identity
from distrun.transport.ansible_start import ARGS_FROM
from distrun.transport.playbook_events import EventReader, PlaybookEvent, PlaybookResult


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: our venv's tools first, our config, a fact cache.

    The fact cache lets ``--dry-run`` show detected GPUs and interfaces without contacting nodes.
    """
    venv_bin = str(Path(sys.executable).parent)
    project = paths.project_dir()
    return {
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
        "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(project / "roles"),
        # ansible-runner turns host key checking off unless told otherwise: nodes are trusted
        # through known_hosts, never blindly.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        # A stopped node must fail fast (preflight names it within seconds), not hang on connect.
        "ANSIBLE_TIMEOUT": os.environ.get("ANSIBLE_TIMEOUT", "10"),
        # The folder distrun's own ssh sessions look for Ansible's master connections in.
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(paths.ssh_control_dir()),
    }


def playbook_program() -> str | None:
    """The program ansible-runner starts for a playbook: distrun's entry point to ansible-playbook
    (distrun.transport.ansible_start), installed beside this interpreter with distrun; None (ansible-playbook
    itself) where it is not there."""
    program = Path(sys.executable).parent / "distrun-ansible-playbook"
    return str(program) if os.access(program, os.X_OK) else None


def inventory_plugins(inventory: Path) -> str | None:
    """The one inventory plugin that reads this inventory, where its file says which: a YAML file
    that names no plugin of its own (``plugin:``) is the yaml plugin's, an ``.ini`` file the ini
    plugin's. Ansible otherwise tries every enabled plugin on it in turn (the auto plugin parses a
    YAML file once more just to look for ``plugin:``), tens of milliseconds of every run's start.
    None (Ansible's own list) for anything else: a folder, a script, a plugin's configuration."""
    try:
        if not inventory.is_file() or os.access(inventory, os.X_OK):
            return None
        suffix = inventory.suffix.lower()
        if suffix == ".ini":
            return "ansible.builtin.ini"
        if suffix in (".yml", ".yaml"):
            text = inventory.read_text(encoding="utf-8", errors="replace")
            return None if re.search(r"^plugin\s*:", text, re.MULTILINE) else "ansible.builtin.yaml"
    except OSError:
        return None
    return None


def _copy_facts(source: Path, dest: Path) -> None:
    """Every host's cached facts from one jsonfile cache folder to another, 0600, each file
    replaced whole (a reader never sees half of one); dot files are temporary, never copied."""
    for f in source.iterdir():
        if f.is_file() and not f.name.startswith("."):
            tmp = dest / f".{f.name}.tmp"
            shutil.copyfile(f, tmp)
            tmp.chmod(0o600)
            os.replace(tmp, dest / f.name)


# The playbooks whose facts the inventory's cache keeps: those that gather them, as root (setup,
# the preflight of 'distrun check'). A run's playbooks (run.yml, stop, collect) run steps as the
# training user, and any module's answer may carry facts: whatever such a step said stays in that
# run's own cache, never in the one setup, check and every later run read (the node's Python
# that root starts is one of those facts).
KEEPS_FACTS = frozenset({"setup.yml", "playbooks/preflight.yml"})


def _keep_facts(run_cache: Path, inventory: Path, playbook: str) -> None:
    """ansible-runner caches facts per run; keep the newest per host for plans and dry runs,
    from the playbooks that gather them (KEEPS_FACTS) only."""
    if playbook in KEEPS_FACTS and run_cache.is_dir():
        _copy_facts(run_cache, paths.fact_cache_dir(inventory))


def seed_facts(run_cache: Path, inventory: Path) -> None:
    """Start a run's fact cache (ansible-runner points Ansible's at the run's own folder) with the
    inventory's: copied, so the files are new and Ansible's cache timeout counts from now."""
    run_cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    _copy_facts(paths.fact_cache_dir(inventory), run_cache)


def _scrub_command(path: Path, late: list[str] | None = None) -> None:
    """ansible-runner stores the whole environment of this process in artifacts/*/command;
    keep only what distrun set for Ansible (the controller's tokens and keys are no record's
    business). ``late``: the arguments an early playbook took from its socket, recorded in its
    command line in place of the socket's."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and isinstance(data.get("env"), dict):
        data["env"] = {k: v for k, v in data["env"].items() if k.startswith(("ANSIBLE_", "AWX_")) or k == "PATH"}
        command = data.get("command")
        if late is not None and isinstance(command, list) and command[1:2] == [ARGS_FROM]:
            data["command"] = [command[0], *command[3:], *late]
        tmp = path.with_name(".command.tmp")
        tmp.write_text(json.dumps(data))
        tmp.chmod(0o600)
        os.replace(tmp, path)


def runner_kwargs(playbook: str, inventory: Path, run_dir: Path, ident: str, events: EventReader) -> dict[str, Any]:
    """What every playbook's ansible-runner call shares: the run's private data directory (0700),
    distrun's project, environment and entry point, quiet, no env files."""
    project = paths.project_dir()
    private = run_dir / "ansible"
    private.mkdir(parents=True, exist_ok=True, mode=0o700)
    private.chmod(0o700)
    envvars = ansible_env()
    plugin = inventory_plugins(inventory)
    if plugin and "ANSIBLE_INVENTORY_ENABLED" not in os.environ:
        envvars["ANSIBLE_INVENTORY_ENABLED"] = plugin
    return {"private_data_dir": str(private), "project_dir": str(project), "playbook": str(project / playbook),
            "inventory": str(inventory), "envvars": envvars, "ident": ident, "event_handler": events,
            "binary": playbook_program(), "quiet": True, "suppress_env_files": True}


def playbook_result(playbook: str, runner: Any, events: EventReader, inventory: Path, late: list[str] | None = None,
                    interrupted: bool = False) -> PlaybookResult:
    """A finished call's result; its recorded command scrubbed and its facts kept for the inventory.
    ``interrupted``: SIGINT, SIGTERM or SIGHUP came while it ran, even as its last task ended: the
    result says 'canceled', so that the signal is never lost to a playbook that finished anyway."""
    artifact_dir = Path(runner.config.artifact_dir)
    _scrub_command(artifact_dir / "command", late)
    _keep_facts(artifact_dir / "fact_cache", inventory, playbook)
    return PlaybookResult(
        playbook=playbook,
        rc=int(runner.rc if runner.rc is not None else 1),
        status="canceled" if interrupted else str(runner.status),
        hosts=events.hosts,
        artifact_dir=artifact_dir,
    )


class FlagSignals:
    """While a playbook runs, SIGINT, SIGTERM and SIGHUP (unless ignored) only set a flag that
    stops it (what ansible-runner installs for its own runs); the handlers before are restored
    after. Nothing in another thread."""

    def __init__(self) -> None:
        self.raised = False
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> FlagSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in terminating.taken():
                self.saved[signum] = signal.signal(signum, self._flag)
        return self

    def _flag(self, signum: int, frame: Any) -> None:
        self.raised = True
        terminating.note(signum)  # the exit code tells SIGTERM from Ctrl-C

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self.saved.items():
            if previous is not None:
                signal.signal(signum, previous)


def run_playbook(
    playbook: str,
    inventory: Path,
    run_dir: Path,
    *,
    extravars: Mapping[str, Any] | None = None,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    check: bool = False,
    ident: str | None = None,
    cached_facts: bool = False,
    forks: int | None = None,
) -> PlaybookResult:
    """Run a playbook through ansible-runner. ``cached_facts``: the plays see the facts the
    inventory's cache holds (gathered by setup, 'distrun check' or a first run) without gathering.
    ``forks``: this run's forks, over ansible.cfg's and the environment's."""
    import ansible_runner  # imported late: it is slow, and --help should stay fast

    ident = ident or uuid.uuid4().hex
    events = EventReader(on_event)
    kwargs = runner_kwargs(playbook, inventory, run_dir, ident, events)
    if cached_facts:
        seed_facts(Path(kwargs["private_data_dir"]) / "artifacts" / ident / "fact_cache", inventory)
    cmdline: list[str] = []
    if check:
        cmdline.append("--check")
    if kwargs["binary"] is not None:  # ansible-runner names the playbook to ansible-playbook only
        cmdline.append(shlex.quote(kwargs["playbook"]))
    # Without a cancel callback ansible-runner would install SIGINT/SIGTERM handlers of its own
    # and leave them in place; ours only set a flag while the playbook runs, and are restored after.
    # A person's verb on a cluster with people: their login and folder, over everything else.
    extravars = {**(extravars or {}), **identity.playbook_vars(inventory, playbook)}
    with FlagSignals() as signals:
        runner = ansible_runner.run(**kwargs, extravars=dict(extravars), limit=limit, tags=tags,
                                    skip_tags=skip_tags, cmdline=" ".join(cmdline) or None,
                                    cancel_callback=lambda: signals.raised, **({"forks": forks} if forks else {}))
    return playbook_result(playbook, runner, events, inventory, interrupted=signals.raised)


