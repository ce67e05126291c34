"""The command line on the real cluster where the world leaves it: a train whose reader goes
away (distrun train ... | head -c1) runs to its end and its record says how it ended, never a
record that a later 'distrun runs' calls lost; distrun exits 7, as cli.md's table says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, distrun, new_train_run


def test_a_train_piped_into_head_ends_its_record_as_the_run_ended(provisioned, distrun_home, cell_script):
    before = set((distrun_home / "runs").glob("*-train-*"))
    exe = str(Path(sys.executable).parent / "distrun")
    proc = subprocess.run(["bash", "-c", '"$@" | head -c1 >/dev/null; echo "exit=${PIPESTATUS[0]}" >&2', "bash",
                           exe, "train", "--inventory", "test", "--script", str(cell_script)],
                          cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=900)
    assert proc.stderr.strip().splitlines()[-1] == "exit=7", proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    run = new_train_run(distrun_home, before)
    assert run is not None, proc.stderr[-3000:]
    listed = distrun("runs", "--json", timeout=300)
    assert listed.rc == 0, listed.stderr
    (mine,) = [r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == run.name]
    assert mine["status"] == "succeeded" and mine["rc"] == 0, mine
    status = distrun("status", run.name, "--json", timeout=300)
    assert status.rc == 0 and json.loads(status.stdout)["state"] == "succeeded", status.stdout + status.stderr
