"""train --wait: the option as the command line reads it, and the waiting claim run for real
against this machine's node claim (a local host with 4 GPUs): another run holds GPUs, lets them
go while the new run waits, and the new run then holds them; a bound that passes gives the
refusal; Ctrl-C while waiting leaves nothing claimed."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import ExitCode, UserError
from distrun.planning.request import RunPolicy
from distrun.run import busy, pending, train

from .test_long_runs import claims_folder, gpu_cluster

INVENTORY = """\
all:
  children:
    head:
      hosts:
        node1: {ansible_host: 10.0.0.1}
    workers:
      hosts:
        node1: {ansible_host: 10.0.0.1, gpus: 2, slots: 2}
"""
FIRST, SECOND, THIRD = "20260101-000000-train-fa01", "20260101-000000-train-fa02", "20260101-000000-train-fa03"


def train_args(tmp_path: Path, monkeypatch, *args: str) -> tuple[int, str, RunPolicy | None]:
    inventory = tmp_path / "inv" / "hosts.yml"
    inventory.parent.mkdir(exist_ok=True)
    inventory.write_text(INVENTORY)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    seen: list[RunPolicy] = []
    monkeypatch.setattr(train.EarlyPlaybook, "for_training_run", staticmethod(lambda *a, **k: None))

    def run_job(request, *args, **kwargs) -> int:  # noqa: ANN001,ANN002,ANN003
        seen.append(request.policy)
        return 0

    monkeypatch.setattr(train, "run_job", run_job)
    result = CliRunner().invoke(main, ["train", "-i", str(inventory), "--script", str(script), *args],
                                prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    return result.exit_code, result.stderr, seen[0] if seen else None


@pytest.mark.parametrize("args,wait_s", [((), None), (("--wait",), 600), (("--wait", "30"), 30),
                                         (("--wait", "--detach"), 600), (("--wait=5",), 5)])
def test_wait_alone_is_600_seconds_and_takes_a_number(tmp_path, monkeypatch, args, wait_s):
    code, err, policy = train_args(tmp_path, monkeypatch, *args)
    assert code == 0, err
    assert policy is not None and policy.wait_s == wait_s


@pytest.mark.parametrize("args,said", [
    (("--wait", "x"), "--wait: 'x' is not a whole number; give a whole number from 1 to 86400 (seconds)"),
    (("--wait", "0"), "--wait: 0 is out of range; give a whole number from 1 to 86400 (seconds)"),
    (("--wait", "--dry-run"), "--wait and --dry-run: a dry run claims nothing, so there is nothing to wait for; "
                              "drop one of them"),
    (("--wait", "9", "--allow-concurrent"), "--wait and --allow-concurrent: --allow-concurrent claims nothing, so "
                                            "there is nothing to wait for; drop one of them"),
])
def test_wait_mistakes_are_one_line_with_the_fix_and_exit_2(tmp_path, monkeypatch, args, said):
    code, err, policy = train_args(tmp_path, monkeypatch, *args)
    assert (code, policy) == (2, None)
    assert err.strip().splitlines() == [f"distrun: error: train: {said}"]


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A local host of 4 GPUs whose claim sees none of this machine's processes; its claim files
    removed after."""
    view = tmp_path / "proc"
    view.mkdir()
    monkeypatch.setattr(busy, "PROC", str(view))
    monkeypatch.setattr(pending, "WAIT_POLL_S", 0.2)
    name = f"unit-{os.getpid()}-wait"
    yield name
    home = claims_folder()
    for f in [*home.glob(f"busy-{name}.*"), *home.glob(f"busy-{name}@*")]:
        f.unlink()


def test_a_waiting_run_says_so_once_then_holds_the_gpus_the_other_run_let_go(host):
    cluster = gpu_cluster(host)
    first = busy.claim(cluster, [host], FIRST, {host: (0, 1)})
    threading.Timer(1.5, first.release).start()
    said: list[str] = []
    started = time.monotonic()
    held = pending.claim_waiting(cluster, [host], SECOND, {host: (1, 2)}, 30, said.append)
    try:
        assert 1.5 <= time.monotonic() - started < 15
        assert said == [f"waiting up to 30 s for {host}'s GPU 1 held by run {FIRST} (Ctrl-C gives up, leaving "
                        "nothing claimed)"]
        assert held.hosts == [host]
        with pytest.raises(UserError, match=f"GPUs 1,2 are held by run {SECOND}"):
            busy.claim(cluster, [host], THIRD, {host: (1, 2)})
    finally:
        held.release()


def test_the_bound_passing_gives_the_refusal_naming_the_holder_and_holds_nothing(host):
    cluster = gpu_cluster(host)
    first = busy.claim(cluster, [host], FIRST, {host: (0, 1)})
    said: list[str] = []
    started = time.monotonic()
    try:
        with pytest.raises(UserError) as refused:
            pending.claim_waiting(cluster, [host], SECOND, {host: (0, 1)}, 1, said.append)
        assert 1 <= time.monotonic() - started < 15
        assert refused.value.exit_code == ExitCode.BUSY
        assert str(refused.value) == (
            f"{host}: GPUs 0,1 are held by run {FIRST} (starting there now): choose free ones (--hosts {host}:2,3), "
            f"wait for it to end, or stop it with 'distrun stop {FIRST}' (or pass --allow-concurrent) (waited 1 s)")
        assert said == [f"waiting up to 1 s for {host}'s GPUs 0,1 held by run {FIRST} (Ctrl-C gives up, leaving "
                        "nothing claimed)"]
        busy.claim(cluster, [host], THIRD, {host: (2, 3)}).release()  # the free ones: SECOND holds none
    finally:
        first.release()
    busy.claim(cluster, [host], THIRD).release()  # the whole host: nothing of SECOND's is left


def test_a_whole_host_held_is_waited_for_by_name(host):
    cluster = gpu_cluster(host)
    first = busy.claim(cluster, [host], FIRST)
    threading.Timer(1.0, first.release).start()
    said: list[str] = []
    pending.claim_waiting(cluster, [host], SECOND, {}, 30, said.append).release()
    assert said == [f"waiting up to 30 s for {host} held by run {FIRST} (Ctrl-C gives up, leaving nothing claimed)"]


def test_ctrl_c_while_waiting_leaves_nothing_claimed(host):
    cluster = gpu_cluster(host)
    first = busy.claim(cluster, [host], FIRST, {host: (0, 1)})
    # Ctrl-C as the terminal sends it: a real SIGINT to this process, with Python's own handler
    # (an earlier test in this process may have left another one in place).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupt = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            pending.claim_waiting(cluster, [host], SECOND, {host: (0, 1)}, 60, lambda line: None)
    finally:
        interrupt.cancel()
        signal.signal(signal.SIGINT, before)
        first.release()
    busy.claim(cluster, [host], THIRD).release()  # the whole host: the waiting run left no claim


def test_no_wait_or_allow_concurrent_waits_for_nothing():
    for policy in (RunPolicy(), RunPolicy(wait_s=5, allow_concurrent=True)):
        assert pending.held_after_waiting(None, None, "r", policy, print) is None  # type: ignore[arg-type]
