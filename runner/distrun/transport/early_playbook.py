"""run.yml's ansible-playbook started before the run is planned: it imports Ansible while the
runner reads the inventory and plans, then takes its arguments from a Unix socket in the run's
private folder (distrun.transport.ansible_start, ARGS_FROM) and runs as any playbook does."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distrun import paths
from distrun.inventory import identity
from distrun.transport.ansible_bridge import FlagSignals, playbook_result, runner_kwargs, seed_facts
from distrun.transport.ansible_start import ARGS_FROM, unix_address
from distrun.transport.playbook_events import EventReader, PlaybookEvent, PlaybookResult

# The playbook of every training run (its preflight, staging and launch).
RUN_PLAYBOOK = "playbooks/run.yml"
# How long an early playbook's program may take to ask for its arguments (it imports Ansible first,
# a third of a second here) before the playbook is run the usual way instead.
EARLY_WAIT_S = 60


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


class EarlyPlaybook:
    """A playbook's ansible-playbook started before the runner knows its arguments: it imports
    Ansible (a third of a second) while the runner plans the run, then waits for them on a Unix
    socket in the run's private folder (distrun.transport.ansible_start, ARGS_FROM). ``run`` hands them over
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
        from distrun.store.runs import new_run_id

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
        kwargs = runner_kwargs(playbook, inventory, run_dir, ident, events)
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
            seed_facts(Path(self.runner.config.artifact_dir) / "fact_cache", self.inventory)
        self.events.on_event = on_event
        # A person's verb on a cluster with people: their login and folder, over everything else.
        extravars = {**(extravars or {}), **identity.playbook_vars(self.inventory, self.playbook)}
        late = _late_args(limit, extravars, tags, skip_tags)
        with FlagSignals() as signals:
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
        return playbook_result(self.playbook, self.runner, self.events, self.inventory, late if conn is not None else None,
                               interrupted=signals.raised)

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
