"""A run's files sent ahead of its play: the bundle and the run's variables go to each host that
stages them over the run's ssh connection while ansible-playbook starts, and the answer goes to
a gate file the stage step waits for.

Role job's stage step is then one raw command per node (``files/stage.py``), with no module and
its arguments to upload: it unpacks what is waiting in the training user's
``~/.cache/distrun/incoming/<run id>.json`` (a 0600 file in a 0700 folder, written as that user:
the variables may be secrets, so they travel on the ssh session's stdin, never on a command
line) and removes it; a run's first attempt is unpacked by the same script in the preflight
probe's round trip. An upload a run never staged (its preflight failed) and what the probes
staged for a run that was refused are removed by ``discard``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from distrun.inventory.cluster import Cluster
from distrun.transport import nodeprog
from distrun.transport.remote import Done, node_command, run_each

UPLOAD_TIMEOUT_S = 120
# What the gate file says when every host got the run's files.
UPLOADED = "ok"


def write_gate(path: Path, answer: str) -> None:
    """Write a gate file whole (a rename): the play's lookup never reads half an answer."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(answer + "\n")
    os.replace(tmp, path)


def upload_command(user: str, run_id: str, people: bool = False) -> str:
    """Keep stdin as the run's upload, 0600 in a 0700 folder of the training user's home: root with
    that user's filesystem identity where the connection can be root (role job's files.py), so no
    process of that user's, which any job of the account could trace, ever reads the run's secrets."""
    return node_command(user, "put", {"user": user, "run": run_id}, "files", people=people)


class Upload:
    """The run's files going to its stage hosts, all at once, in the background; the answer
    ("ok", or which host failed and why) goes to the gate file when every upload ended."""

    def __init__(self, cluster: Cluster, hosts: Sequence[str], run_id: str, bundle: Path, env_file: str,
                 gate: Path, after: threading.Event | None = None, told: Callable[[], object] | None = None) -> None:
        """``after``: wait (up to 10 s) for it first: the ssh masters the upload rides on; ``told``
        is called once every host got the files, before the gate says so."""
        self.told = told
        payload = json.dumps({"bundle": bundle.read_text().strip(),
                              "env": Path(env_file).read_text() if env_file else ""})
        self.answer: str | None = None  # UPLOADED, or which host failed and why
        self.ended_at: float | None = None  # time.monotonic() of the answer
        self.thread = threading.Thread(target=self._send, args=(cluster, list(hosts), run_id, payload, gate, after),
                                       daemon=True)
        self.thread.start()

    def _send(self, cluster: Cluster, hosts: list[str], run_id: str, payload: str, gate: Path,
              after: threading.Event | None) -> None:
        if after is not None:
            after.wait(10)
        nodes = {n.name: n for n in cluster.nodes}
        command = upload_command(cluster.user, run_id, cluster.has_people)
        try:
            done = run_each(nodes, {h: command for h in hosts}, UPLOAD_TIMEOUT_S, inputs={h: payload for h in hosts})
            failed = {h: _why(d) for h, d in done.items() if not _put(d)}
            answer = UPLOADED if not failed else "; ".join(f"{h}: {why}" for h, why in failed.items())
        except Exception as exc:  # noqa: BLE001 - the gate must get an answer, whatever happened
            answer = f"{type(exc).__name__}: {exc}"
        if answer == UPLOADED and self.told is not None:
            self.told()
        write_gate(gate, answer)
        self.answer, self.ended_at = answer, time.monotonic()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


def _put(done: Done) -> bool:
    said = nodeprog.answer(done.out, "put") if done.rc == 0 else None
    return said is not None and isinstance(said.get("put"), int)


def _why(done: Done) -> str:
    said = nodeprog.answer(done.out, "put")
    return str(said["error"]) if said and said.get("error") else done.last_line()


def discard(cluster: Cluster, hosts: Sequence[str], run_id: str,
            created: Mapping[str, Sequence[str]] | None = None) -> None:
    """Remove an upload that was never staged (a run refused before its stage step): it may hold
    the run's secrets; and ``created`` (host -> the run's folders the preflight's probe staged
    there before the run was refused), with the training user's rights (files.py). Best effort:
    a host that does not answer keeps them, its user's (the upload 0600)."""
    nodes = {n.name: n for n in cluster.nodes}
    commands = {h: node_command(cluster.user, "remove", {"user": cluster.user, "run": run_id,
                                                         "paths": list((created or {}).get(h, ()))}, "files",
                                people=cluster.has_people)
        for h in hosts if h in nodes}
    run_each(nodes, commands, 10)
