"""distrun's supervisor of a detached mpirun run (train --detach --max-restarts N): it runs on the
head in place of mpirun, inside the head's unit of the attempt (launch.py), and starts mpirun
again after a failure while restarts are left, with the restart rule the controller's follower
uses (restartrule.py) and its tries' parts (tries.py), both composed in front of this file.

``python3 -I supervise.py CONFIG``; standard library only, Python 3.9 or newer. CONFIG is a JSON
file the runner wrote into the attempt's folder: ``argv`` (mpirun's command line, with its
``--hostfile`` and ``-np``), ``hosts`` ([[name, slots], ...] in the plan's order), ``head``,
``np`` (--np, or null: one rank per slot), ``max_restarts``, ``restart`` (distrun's restarts
before this attempt), ``exclude_failed``, ``probe`` (the ssh command line mpirun's daemons log in
with, to which a host and ``true`` are added), ``env`` ([[NAME, VALUE], ...] of mpirun's ``-x``
whose value is the restart's: DISTRUN_RESTART), ``record`` (the record's file name), ``backoff_s``.

What it decides from: mpirun's exit (its code or the signal that ended it) and its own probe of
each host, an ssh login as the training user over the run's mesh whose forced command answers
``true`` (mesh.py). A host that does not answer is lost; nothing else names a failed node, and it
reads no file and no line of the job's, so a job cannot make it restart, stop or leave out a node
by writing or printing anything. mpirun's own exit code says only that the attempt failed.

Its record (``record``, in the attempt's folder) holds every try: when it started and ended, how
it ended, the hosts it ran on, the hosts the next one leaves out and why; one line per event goes
to stderr too (the launcher's log). The supervisor is the training user's process, as the job is:
it makes itself undumpable (no process of that account may trace it or open its descriptors),
but a job can still rewrite the record's file or kill the supervisor. What the controller trusts
is the run's end as root's record of the unit says it (launch.py); the record says how it got there.
"""

import json
import os
import signal
import subprocess
import sys
import time

if "restart_hosts" not in globals():  # run as a file (the controller's tests): its parts from beside it
    for _part in ("restartrule.py", "tries.py"):
        _PART = os.path.join(os.path.dirname(os.path.abspath(__file__)), _part)
        with open(_PART, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _PART, "exec"))  # the same one namespace as the composed source on a node

WATCH_S = 5.0  # while mpirun runs, how often the other hosts are probed
WATCH_MISSES = 2  # a host that misses this many probes in a row is lost: mpirun is stopped
STOP_S = 10  # what mpirun's process group gets between TERM and KILL
RECORD_VERSION = 1


def _undumpable() -> None:
    """No process of the training user's (the job's) may ptrace this one or open its descriptors."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


class Supervisor:
    """One detached attempt's tries of mpirun, the decisions between them and their record."""

    def __init__(self, cfg: dict, folder: str) -> None:
        self.cfg, self.folder = cfg, folder
        self.hosts = [[str(n), int(s)] for n, s in cfg["hosts"]]
        with_hosts(cfg["argv"], "", 0)  # its --hostfile and -np are there
        # Read once, before any rank starts: a later try's hostfile is this text less the hosts left out.
        with open(cfg["argv"][cfg["argv"].index("--hostfile") + 1], encoding="utf-8") as f:
            self.hostfile = f.read()
        self.tries: list = []
        self.child: "subprocess.Popen | None" = None
        self.stopped: "str | None" = None
        self.record = {"version": RECORD_VERSION, "reported_by": "the supervisor on the head", "head": cfg["head"],
                       "max_restarts": int(cfg["max_restarts"]), "exclude_failed": bool(cfg["exclude_failed"]),
                       "tries": self.tries, "state": "running", "reason": ""}

    def say(self, line: str) -> None:
        print(f"distrun supervisor: {line}", file=sys.stderr, flush=True)

    def save(self) -> None:
        """The record, replaced whole; a failure to write it (a job put something in its way) is
        said on stderr and never stops the tries."""
        path = os.path.join(self.folder, self.cfg["record"])
        tmp = f"{path}.tmp"
        for _ in range(2):
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(self.record, f, indent=1, sort_keys=True)
                os.replace(tmp, path)
                return
            except OSError as e:
                why = e
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self.say(f"cannot write the record {path}: {why}")

    def on_signal(self, signum: int, _frame: object) -> None:
        """A stop of the unit: mpirun gets it too, and no try follows."""
        self.stopped = signal.Signals(signum).name[3:]
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)
            except OSError:
                pass

    def start(self, k: int, argv: list) -> int:
        restart = int(self.cfg.get("restart", 0)) + k
        env = {name: str(restart) if name == "DISTRUN_RESTART" else value for name, value in self.cfg.get("env", [])}
        argv = with_env(argv, env)
        self.tries.append({"try": k, "restart": restart, "hosts": [n for n, _ in self.hosts], "started": time.time(),
                           "ended": None, "rc": None, "signal": None, "excluded": [], "lost": [], "decision": ""})
        self.save()
        self.say(f"try {k} (DISTRUN_RESTART {restart}) on {', '.join(n for n, _ in self.hosts)}")
        # mpirun leads a process group of its own: a stop reaches its local ranks too.
        self.child = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
        rc = self.watch()
        self.tries[-1].update(ended=time.time(), **ended(rc))
        self.save()
        return rc

    def watch(self) -> int:
        """Wait for mpirun's end, probing the other hosts meanwhile: a host lost mid-try (it
        misses WATCH_MISSES probes in a row) ends the try, which mpirun alone may not notice for
        minutes (a node that vanished resets none of its connections)."""
        assert self.child is not None
        others = [n for n, _ in self.hosts if n != self.cfg["head"]] if self.cfg.get("probe") else []
        misses = {h: 0 for h in others}
        while True:
            try:
                return self.child.wait(timeout=float(self.cfg.get("watch_s", WATCH_S)))
            except subprocess.TimeoutExpired:
                pass
            if not others or self.stopped:
                continue
            answered = probe(list(self.cfg["probe"]), others)
            for host, ok in answered.items():
                misses[host] = 0 if ok else misses[host] + 1
            gone = sorted(h for h, n in misses.items() if n >= WATCH_MISSES)
            if gone and self.child.poll() is None:
                self.say(f"{', '.join(gone)} stopped answering: stopping this try")
                self.tries[-1]["lost"] = gone
                self.stop_child()

    def stop_child(self) -> None:
        """TERM to mpirun's process group, KILL after STOP_S."""
        assert self.child is not None
        for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, None)):
            try:
                os.killpg(self.child.pid, sig)
            except OSError:
                return
            try:
                self.child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def decide(self, k: int) -> "tuple[bool, str, list]":
        """After try k failed: whether another starts, why, and the hosts it leaves out."""
        if self.stopped:
            return False, f"stopped by signal {self.stopped}", []
        if k >= int(self.cfg["max_restarts"]):
            return False, f"no restarts left ({self.cfg['max_restarts']} used)", []
        until = cert_end(self.cfg["cert"]) if self.cfg.get("cert") else None
        if until is not None and until < time.time() + 60:
            return False, ("the attempt's ssh certificate, with which mpirun's daemons log in, expired at "
                           f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(until))}: a restart could not reach "
                           "the other hosts (DISTRUN_RUN_CERT_MINUTES sets how long it lasts)"), []
        others = [n for n, _ in self.hosts if n != self.cfg["head"]]
        answered = probe(list(self.cfg["probe"]), others) if self.cfg.get("probe") else {h: True for h in others}
        lost = sorted({*(h for h, ok in answered.items() if not ok), *self.tries[-1]["lost"]})
        self.tries[-1]["lost"] = lost
        world = next_world_size(self.hosts, self.cfg.get("np"))  # noqa: F821 - restartrule.py, in front of this file
        said = restart_hosts(self.hosts, [n for n, _ in self.hosts], self.cfg["head"],  # noqa: F821
                             self.cfg.get("np"), world, None, lost, bool(self.cfg["exclude_failed"]))
        if said["refused"]:
            return False, said["refused"], []
        why = (f"{', '.join(lost)} did not answer: restart without it" if said["exclude"]
               else "every host answered: restart on the same hosts")
        return True, why, list(said["exclude"])

    def release(self) -> None:
        """The other hosts' relays wait for the next try's daemons: none comes (relay.py's DONE)."""
        if self.stopped or not self.cfg.get("release"):
            return
        lost = set(self.tries[-1]["lost"]) if self.tries else set()
        procs = [subprocess.Popen([*self.cfg["probe"], host, *self.cfg["release"]], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for host, _ in self.hosts if host != self.cfg["head"] and host not in lost]
        for proc in procs:
            try:
                proc.wait(timeout=PROBE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run(self) -> int:
        try:
            return self.tries_until_end()
        finally:
            self.release()

    def tries_until_end(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        argv, k = list(self.cfg["argv"]), 0
        while True:
            rc = self.start(k, argv)
            if rc == 0:
                self.tries[-1]["decision"] = "the job ended 0"
                self.record.update(state="succeeded", reason="")
                self.save()
                self.say(f"try {k} ended 0")
                return 0
            again, why, drop = self.decide(k)
            self.tries[-1].update(decision=why, excluded=drop)
            code = self.tries[-1]["rc"]
            self.say(f"try {k} ended with exit {code}" + (f" (signal {self.tries[-1]['signal']})"
                                                          if self.tries[-1]["signal"] else "") + f": {why}")
            if not again:
                self.record.update(state="stopped" if self.stopped else "failed", reason=why)
                self.save()
                return code
            if drop:
                self.hosts = [[n, s] for n, s in self.hosts if n not in drop]
                argv = self.without(argv, drop, k + 1)
            self.save()
            time.sleep(float(self.cfg.get("backoff_s", 1)) * (k + 1))
            if self.stopped:
                self.record.update(state="stopped", reason=f"stopped by signal {self.stopped}")
                self.save()
                return code
            k += 1

    def without(self, argv: list, drop: list, k: int) -> list:
        """mpirun's command line for try k, on a hostfile of its own without the hosts dropped."""
        self.hostfile = text = hostfile_without(self.hostfile, drop)
        path = os.path.join(self.folder, f"hostfile-{int(k)}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return with_hosts(argv, path, next_world_size(self.hosts, self.cfg.get("np")))  # noqa: F821


def main(argv: list) -> int:
    if len(argv) != 1:
        print("supervise: give the config file", file=sys.stderr)
        return 2
    path = os.path.abspath(argv[0])
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        supervisor = Supervisor(cfg, os.path.dirname(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"supervise: {path}: {e}", file=sys.stderr)
        return 2
    _undumpable()
    code = supervisor.run()
    if supervisor.stopped:  # ended by the signal, as root's record of the unit must say (a stop, not an exit)
        sig = signal.Signals[f"SIG{supervisor.stopped}"]
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
