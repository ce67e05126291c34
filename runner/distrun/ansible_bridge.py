"""Run distrun's playbooks through ansible-runner and turn its events into host progress.

Each call gets a private data directory inside the run directory (0700): ansible-runner records
the full environment in ``artifacts/<id>/command``, so nothing secret is passed as extravars and
the directory is readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths, terminating
from .ansible_start import ARGS_FROM, unix_address
from .handshake import STEP_FACT


@dataclass
class HostProgress:
    name: str
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    last_error: str = ""
    # What the playbook published about this host: the public facts its tasks set (set_fact).
    facts: dict[str, Any] = field(default_factory=dict)
    # The step the host failed in: the last distrun_step the play published before (its hosts go
    # through the tasks together, so a step is the play's, and a run_once task may publish it).
    # A playbook's steps say so themselves; the runner never reads a play's or a task's name.
    failed_step: str = ""

    @property
    def state(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "ok"


@dataclass
class PlaybookEvent:
    kind: str  # "play", "task", "ok", "changed", "failed", "unreachable", "skipped", "stats"
    host: str | None
    task: str
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class PlaybookResult:
    playbook: str
    rc: int
    status: str
    hosts: dict[str, HostProgress]
    artifact_dir: Path

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.status == "successful"

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    def failures(self) -> list[HostProgress]:
        return [h for h in self.hosts.values() if h.failed or h.unreachable]

    def fact(self, name: str) -> Any:
        """A fact the playbook published (a run_once one arrives with one host), or None."""
        return next((h.facts[name] for h in self.hosts.values() if name in h.facts), None)


def _message(res: Mapping[str, Any]) -> str:
    """The most useful line of a failed task: what the command said beats Ansible's summary.

    "non-zero return code" and a loop's "One or more items failed" name no cause; the failing
    item's stderr (ssh's "Connection timed out", a Python traceback's last line) does.
    """
    for item in res.get("results") or []:
        if isinstance(item, Mapping) and item.get("failed"):
            inner = _message(item)
            label = item.get("item")
            if inner:
                return f"{label}: {inner}" if isinstance(label, str) else inner
    for key in ("stderr", "module_stderr", "msg", "stdout"):
        value = res.get(key)
        if not value:
            continue
        lines = [ln.strip() for ln in str(value).strip().splitlines() if ln.strip()]
        if lines:
            return lines[-1][:400] if key != "msg" else " ".join(lines)[:400]
    return ""


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
    (distrun.ansible_start), installed beside this interpreter with distrun; None (ansible-playbook
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


def _keep_facts(run_cache: Path, inventory: Path) -> None:
    """ansible-runner caches facts per run; keep the newest per host for plans and dry runs."""
    if run_cache.is_dir():
        _copy_facts(run_cache, paths.fact_cache_dir(inventory))


def _seed_facts(run_cache: Path, inventory: Path) -> None:
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


class EventReader:
    """Turns ansible-runner's events into host progress and PlaybookEvents for ``on_event``;
    keeps the facts each host's tasks publish (set_fact) and the step it failed in."""

    def __init__(self, on_event: Callable[[PlaybookEvent], None] | None = None) -> None:
        self.on_event = on_event
        self.hosts: dict[str, HostProgress] = {}
        self.task = ""
        self.step = ""  # the last distrun_step any host published

    def host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress(name))

    def emit(self, ev: PlaybookEvent) -> None:
        if self.on_event is not None:
            self.on_event(ev)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        name = data.get("host")
        task = str(data.get("task") or self.task)
        res = data.get("res") or {}
        if kind == "playbook_on_play_start":
            self.emit(PlaybookEvent("play", None, str(data.get("play", ""))))
        elif kind == "playbook_on_task_start":
            self.task = task
            self.emit(PlaybookEvent("task", None, task))
        elif kind == "runner_on_start" and name:
            self.host(name).task = task
            self.emit(PlaybookEvent("start", name, task))
        elif kind == "runner_on_ok" and name:
            h = self.host(name)
            h.ok += 1
            changed = bool(res.get("changed"))
            h.changed += int(changed)
            facts = res.get("ansible_facts")
            if str(data.get("task_action", "")).endswith("set_fact") and isinstance(facts, Mapping):
                # What a step publishes: the public facts it sets (a leading _ marks a role's own).
                h.facts.update({k: v for k, v in facts.items() if not str(k).startswith("_")})
                self.step = str(facts.get(STEP_FACT, self.step))
            self.emit(PlaybookEvent("changed" if changed else "ok", name, task, data=res))
        elif kind == "runner_on_failed" and name and not data.get("ignore_errors"):
            h = self.host(name)
            h.failed += 1
            facts = res.get("ansible_facts")
            if str(data.get("task_action", "")).endswith("set_fact") and isinstance(facts, Mapping):
                # A task that publishes and fails its node (the preflight's judge): what it published counts.
                h.facts.update({k: v for k, v in facts.items() if not str(k).startswith("_") and k != STEP_FACT})
            h.last_error = f"{task}: {_message(res)}"
            h.failed_step = h.failed_step or self.step
            self.emit(PlaybookEvent("failed", name, task, _message(res), res))
        elif kind == "runner_on_unreachable" and name:
            h = self.host(name)
            h.unreachable = True
            h.last_error = f"{task}: {_message(res)}"
            h.failed_step = h.failed_step or self.step
            self.emit(PlaybookEvent("unreachable", name, task, _message(res), res))
        elif kind == "runner_on_skipped" and name:
            self.host(name).skipped += 1
            self.emit(PlaybookEvent("skipped", name, task))
        elif kind == "playbook_on_stats":
            self.emit(PlaybookEvent("stats", None, "", data=data))
        return True


def _late_args(limit: str | None, extravars: Mapping[str, Any] | None, tags: str | None,
               skip_tags: str | None) -> list[str]:
    """The arguments ansible-runner would add for these (in its order and form)."""
    args: list[str] = []
    if limit is not None:
        args += ["--limit", limit]
    if extravars:
        args += ["-e", json.dumps(dict(extravars))]
    if tags:
        args += ["--tags", tags]
    if skip_tags:
        args += ["--skip-tags", skip_tags]
    return args


def _runner_kwargs(playbook: str, inventory: Path, run_dir: Path, ident: str, events: EventReader) -> dict[str, Any]:
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


def _result(playbook: str, runner: Any, events: EventReader, inventory: Path, late: list[str] | None = None) -> PlaybookResult:
    artifact_dir = Path(runner.config.artifact_dir)
    _scrub_command(artifact_dir / "command", late)
    _keep_facts(artifact_dir / "fact_cache", inventory)
    return PlaybookResult(
        playbook=playbook,
        rc=int(runner.rc if runner.rc is not None else 1),
        status=str(runner.status),
        hosts=events.hosts,
        artifact_dir=artifact_dir,
    )


class _FlagSignals:
    """While a playbook runs, SIGINT, SIGTERM and SIGHUP (unless ignored) only set a flag that
    stops it (what ansible-runner installs for its own runs); the handlers before are restored
    after. Nothing in another thread."""

    def __init__(self) -> None:
        self.raised = False
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> _FlagSignals:
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
    kwargs = _runner_kwargs(playbook, inventory, run_dir, ident, events)
    if cached_facts:
        _seed_facts(Path(kwargs["private_data_dir"]) / "artifacts" / ident / "fact_cache", inventory)
    cmdline: list[str] = []
    if check:
        cmdline.append("--check")
    if kwargs["binary"] is not None:  # ansible-runner names the playbook to ansible-playbook only
        cmdline.append(shlex.quote(kwargs["playbook"]))
    # ansible-runner installs its own SIGINT/SIGTERM handlers (they only set a flag) and leaves
    # them in place: without restoring ours, Ctrl-C while a job is followed would do nothing.
    with _FlagSignals():
        runner = ansible_runner.run(**kwargs, extravars=dict(extravars or {}), limit=limit, tags=tags,
                                    skip_tags=skip_tags, cmdline=" ".join(cmdline) or None,
                                    **({"forks": forks} if forks else {}))
    return _result(playbook, runner, events, inventory)


# The playbook of every training run (its preflight, staging and launch).
RUN_PLAYBOOK = "playbooks/run.yml"
# How long an early playbook's program may take to ask for its arguments (it imports Ansible first,
# a third of a second here) before the playbook is run the usual way instead.
EARLY_WAIT_S = 60


class EarlyPlaybook:
    """A playbook's ansible-playbook started before the runner knows its arguments: it imports
    Ansible (a third of a second) while the runner plans the run, then waits for them on a Unix
    socket in the run's private folder (distrun.ansible_start, ARGS_FROM). ``run`` hands them over
    and follows the playbook as run_playbook would; ``cancel`` closes the socket, and the program
    ends without running anything. Only where distrun's entry point is installed."""

    def __init__(self, playbook: str, inventory: Path, runner: Any, thread: threading.Thread,
                 events: EventReader, sock: Any, where: Path, flag: list[bool]) -> None:
        self.playbook, self.inventory = playbook, inventory
        self.runner, self.thread, self.events = runner, thread, events
        self.sock, self.where, self.flag = sock, where, flag
        self.done = False
        self.run_id: str | None = None  # set by for_training_run

    @classmethod
    def for_training_run(cls, inventory: Path, workdir: bool) -> EarlyPlaybook | None:
        """run.yml's, for a new training run, in the folder of its record-to-be (made here, 0700,
        under a new run id): it imports Ansible (a third of a second) while the inventory is read
        and the run planned. None where it is not started (the folder is then removed): with a
        workdir (its sync and prepare step come before run.yml, and take as long as the project
        makes them), or anything unusual, left to the playbook's usual start, which says what is
        wrong where it matters."""
        if workdir:
            return None
        from .runs import new_run_id

        run_id = new_run_id("train")
        run_dir = paths.runs_dir() / run_id
        run_dir.mkdir(mode=0o700)
        try:
            early = cls.start(RUN_PLAYBOOK, inventory, run_dir)
        except Exception:  # noqa: BLE001
            early = None
        if early is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            early.run_id = run_id
        return early

    def discard(self) -> None:
        """Cancel it and remove the run folder for_training_run made: nothing of the run is left."""
        self.cancel()
        if self.run_id is not None:
            shutil.rmtree(paths.runs_dir() / self.run_id, ignore_errors=True)

    @classmethod
    def start(cls, playbook: str, inventory: Path, run_dir: Path) -> EarlyPlaybook | None:
        """Start it, or None where it cannot be (no entry point, no socket)."""
        import socket

        import ansible_runner

        ident = uuid.uuid4().hex
        events = EventReader(None)
        kwargs = _runner_kwargs(playbook, inventory, run_dir, ident, events)
        if kwargs["binary"] is None:  # ansible-playbook itself takes no arguments from a socket
            return None
        where = Path(kwargs["private_data_dir"]) / f"args-{ident[:12]}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address, fd = unix_address(str(where))
            try:
                sock.bind(address)
            finally:
                os.close(fd)
            where.chmod(0o600)
            sock.listen(1)
        except OSError:
            sock.close()
            return None
        flag = [False]  # set: ansible-runner stops the process (its cancel callback)
        cmdline = f"{ARGS_FROM} {shlex.quote(str(where))} {shlex.quote(kwargs['playbook'])}"
        thread, runner = ansible_runner.run_async(**kwargs, cmdline=cmdline, cancel_callback=lambda: flag[0])
        return cls(playbook, inventory, runner, thread, events, sock, where, flag)

    def run(self, *, extravars: Mapping[str, Any] | None = None, on_event: Callable[[PlaybookEvent], None] | None = None,
            limit: str | None = None, tags: str | None = None, skip_tags: str | None = None,
            cached_facts: bool = False) -> PlaybookResult | None:
        """Give the playbook its arguments and follow it to its end, as run_playbook would. None
        when the program ended, or did not ask for them within EARLY_WAIT_S (it is stopped): nothing
        ran, the playbook is to be run the usual way. SIGINT and SIGTERM meanwhile stop it, as they
        stop any playbook: the result says 'canceled'."""
        import socket

        assert not self.done, "an early playbook runs once"
        self.done = True
        ident = str(self.runner.config.ident)
        if cached_facts:
            _seed_facts(Path(self.runner.config.artifact_dir) / "fact_cache", self.inventory)
        self.events.on_event = on_event
        late = _late_args(limit, extravars, tags, skip_tags)
        with _FlagSignals() as signals:
            conn = None
            self.sock.settimeout(0.1)
            deadline = time.monotonic() + EARLY_WAIT_S
            while conn is None and self.thread.is_alive() and not signals.raised and time.monotonic() < deadline:
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid != os.getuid():
                    conn.close()
                    conn = None
            self._close()
            if conn is not None:
                with conn:
                    conn.settimeout(None)
                    conn.sendall(json.dumps({"args": late}).encode())
            else:
                self.flag[0] = True
            while self.thread.is_alive():
                self.thread.join(0.2)
                if signals.raised:
                    self.flag[0] = True
        if conn is None and not signals.raised:
            self._discard(ident)
            return None
        return _result(self.playbook, self.runner, self.events, self.inventory, late if conn is not None else None)

    def cancel(self) -> None:
        """Stop the program before it runs anything (a no-op once run): it is told nothing, and
        ansible-runner's record of it is removed."""
        if self.done:
            return
        self.done = True
        self._close()
        self.flag[0] = True
        self.thread.join(10)
        self._discard(str(self.runner.config.ident))

    def _close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            self.where.unlink()

    def _discard(self, ident: str) -> None:
        shutil.rmtree(Path(self.runner.config.private_data_dir) / "artifacts" / ident, ignore_errors=True)
