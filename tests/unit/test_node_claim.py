"""Role job's node program's claim verb (files/claim.py, composed before node.py), run for real on
this machine: runs that hold GPUs share a host while their GPUs are disjoint, a run without GPUs
takes the whole host, and a refusal names the holder, the GPUs it holds and the free ones. Each
claim is its own process, held while its stdin is open, as the controller's ssh session holds it;
what the claim sees of this machine's processes is only those a test links in."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distrun.transport import nodeprog

# Tagged processes of this machine's user: a claim test beside these takes turns with them.
pytestmark = pytest.mark.usefixtures("alone_with_run_tags")


def claims_folder() -> Path:
    return Path("/run/distrun/claims") if os.geteuid() == 0 else Path.home() / ".cache" / "distrun"


ME = pwd.getpwuid(os.getuid()).pw_name  # a claim's owner where sudo names no caller
NOBODY = pwd.getpwnam("nobody")  # another person, the caller sudo named


class Claims:
    """The claims a test holds on one host of its own, by run."""

    def __init__(self, host: str, view: Path) -> None:
        self.host, self.view = host, view
        self.held: dict[str, subprocess.Popen[str]] = {}

    def take(self, run: str, gpus: list[int] | None = None, total: int | None = 4, *, sudo_uid: int | None = None,
             **more: object) -> dict:
        cfg: dict[str, object] = {"host": self.host, "run": run, "hold_s": 60, "proc": str(self.view), **more}
        env = {k: v for k, v in os.environ.items() if k != "SUDO_UID"}
        if sudo_uid is not None:
            env["SUDO_UID"] = str(sudo_uid)  # as sudo sets it for the root entry point's caller
        if gpus is not None:
            cfg["gpu_ids"] = gpus
        if total is not None:
            cfg["total"] = total
        proc = subprocess.Popen([sys.executable, "-I", "-c", nodeprog.text("node"), "claim", json.dumps(cfg)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        got = json.loads(line) if line else {"stderr": proc.communicate(timeout=30)[1]}
        if got.get("claimed"):
            self.held[run] = proc
        else:
            assert proc.wait(timeout=30) == 0, got
        return got

    def let_go(self, run: str) -> None:
        proc = self.held.pop(run)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0

    def kill(self, run: str) -> None:
        proc = self.held.pop(run)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for run in list(self.held):
            self.kill(run)
        folder = claims_folder()
        for f in [*folder.glob(f"busy-{self.host}.*"), *folder.glob(f"busy-{self.host}@*")]:
            f.unlink()


@pytest.fixture
def claims(tmp_path, request):
    view = tmp_path / "proc"
    view.mkdir()
    held = Claims(f"unit-{os.getpid()}-{request.node.name[-24:].strip('_[]')}"[:60], view)
    yield held
    held.close()


def tagged(view: Path, run: str) -> subprocess.Popen[bytes]:
    """A process of run (its tag), which the claim sees."""
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "DISTRUN_RUN_ID": run})
    (view / str(proc.pid)).symlink_to(f"/proc/{proc.pid}")
    return proc


def test_runs_on_disjoint_gpus_share_a_host_and_an_overlap_is_refused_naming_the_holder(claims):
    assert claims.take("run-a", [0, 1], sudo_uid=NOBODY.pw_uid, owner="forged") == {"verb": "claim", "claimed": True, "runs": [], "gpu_ids": [0, 1]}
    assert claims.take("run-b", [3, 2])["gpu_ids"] == [2, 3]
    refused = claims.take("run-c", [1, 2])
    assert refused == {"verb": "claim", "claimed": False, "held": True, "runs": ["run-a", "run-b"], "gpu_ids": [1, 2],
                       "free": [], "owners": {"run-a": NOBODY.pw_name, "run-b": ME}}
    claims.let_go("run-b")  # its controller let go and it has no process here: its GPUs are free again
    refused = claims.take("run-c", [1, 2])
    assert (refused["runs"], refused["gpu_ids"], refused["free"]) == (["run-a"], [1], [2, 3])
    assert claims.take("run-c", [2, 3])["claimed"] is True


def test_a_run_without_gpus_takes_the_whole_host_and_a_gpu_run_is_refused_by_it_and_it_by_one(claims):
    assert claims.take("whole", None)["claimed"] is True
    refused = claims.take("gpu-run", [0])
    assert (refused["claimed"], refused["held"], refused["runs"]) == (False, True, ["whole"])
    claims.let_go("whole")
    assert claims.take("gpu-run", [0])["claimed"] is True
    refused = claims.take("whole", None, total=None)
    assert (refused["claimed"], refused["held"], refused["runs"]) == (False, True, ["gpu-run"])
    assert claims.take("other-gpus", [1, 2, 3])["claimed"] is True  # a whole-host refusal took nothing


def test_a_detached_runs_processes_keep_its_gpus_and_a_run_with_processes_and_no_gpu_claim_has_the_whole_host(claims):
    assert claims.take("detached", [0, 1])["claimed"] is True
    proc = tagged(claims.view, "detached")
    try:
        claims.let_go("detached")  # the controller is gone; the ranks run on
        refused = claims.take("late", [1])
        assert (refused["held"], refused["runs"], refused["gpu_ids"]) == (False, ["detached"], [1])
        assert claims.take("late", [2])["claimed"] is True
        refused = claims.take("whole", None)
        assert (refused["held"], refused["runs"]) == (False, ["detached", "late"])
    finally:
        proc.kill()
        proc.wait()
    # Its processes ended: its record is dead, dropped by the next claim.
    assert claims.take("later", [0, 1])["claimed"] is True
    records = json.loads((claims_folder() / f"busy-{claims.host}.gpus").read_text())
    assert sorted(records) == ["late", "later"]
    claims.let_go("late")
    claims.let_go("later")
    old = tagged(claims.view, "from-before")  # a run that holds no GPU claim here (started without one)
    try:
        refused = claims.take("gpu-run", [3])
        assert (refused["runs"], refused["gpu_ids"], refused["held"]) == (["from-before"], [], False)
    finally:
        old.kill()
        old.wait()


def test_a_killed_gpu_holder_lets_its_gpus_go_and_the_ask_says_which_are_free(claims):
    assert claims.take("a", [0])["claimed"] is True
    assert claims.take("b", [2])["claimed"] is True
    assert claims.take("c", None, ask=True) == {"verb": "claim", "claimed": False, "asked": True, "free": [1, 3],
                                                "runs": [], "owners": {"a": ME, "b": ME}}
    claims.kill("a")  # its controller's session died: the kernel let its lock go
    assert claims.take("c", None, ask=True)["free"] == [0, 1, 3]
    assert claims.take("c", [0, 1])["claimed"] is True


def test_a_whole_host_holder_that_was_killed_leaves_no_name_that_refuses_a_gpu_claim(claims):
    assert claims.take("whole", None)["claimed"] is True
    claims.kill("whole")
    assert (claims_folder() / f"busy-{claims.host}.run").read_text() == "whole\n"  # left behind
    started = time.monotonic()
    assert claims.take("gpu-run", [0])["claimed"] is True
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("cfg", "message"), [
    ({"gpu_ids": "0,1"}, "claim: gpu_ids '0,1' is not a list of GPU indices"),
    ({"gpu_ids": [0, -1]}, "claim: gpu_ids [0, -1] is not a list of GPU indices"),
    ({"gpu_ids": [True]}, "claim: gpu_ids [True] is not a list of GPU indices"),
    ({"total": "4"}, "claim: total '4' is not a number of GPUs"),
])
def test_a_bad_gpu_claim_is_one_line_and_exit_2(cfg, message):
    out = subprocess.run([sys.executable, "-I", "-c", nodeprog.text("node"), "claim",
                          json.dumps({"host": "h", "run": "r", **cfg})], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def _slurm_proc(view: Path, pid: int, ppid: int, uid: int, tag: str | None, comm: str = "sleep") -> None:
    """A process in slurmd's cgroup as /proc would show it (proctrack/linuxproc keeps a job's there)."""
    folder = view / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} " + " ".join(["0"] * 15) + " 12345 0 0\n")
    (folder / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (folder / "environ").write_bytes(f"DISTRUN_RUN_ID={tag}\0".encode() if tag else b"")
    (folder / "cgroup").write_text("0::/system.slice/slurmd.service\n")


def test_what_an_ended_slurm_job_left_behind_holds_no_host_and_a_running_job_does(claims):
    """A running Slurm job's steps (under root's slurmstepd) keep the host theirs; the pause
    process an ended job left in slurmd's cgroup, tagged with its run, keeps nothing."""
    (claims.view / "1").mkdir()
    (claims.view / "1" / "cgroup").write_text("0::/init.scope\n")
    user = {"user": NOBODY.pw_name} if os.getuid() == 0 else {}
    uid = NOBODY.pw_uid if os.getuid() == 0 else os.getuid()
    _slurm_proc(claims.view, 4200001, 1, 0, None, comm="slurmstepd")
    _slurm_proc(claims.view, 4200002, 4200001, uid, "slurm-running")
    _slurm_proc(claims.view, 4200003, 1, uid, "slurm-ended", comm="catatonit")
    refused = claims.take("next", None, total=None, **user)
    assert (refused["claimed"], refused["runs"]) == (False, ["slurm-running"]), refused
    for pid in (4200001, 4200002):  # the running job ends; its pause process stays
        for f in (claims.view / str(pid)).iterdir():
            f.unlink()
        (claims.view / str(pid)).rmdir()
    assert claims.take("next", None, total=None, **user)["claimed"] is True
