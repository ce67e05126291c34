"""Jobs that reach for root's side of the cluster through what the training user can write: a
module planted where root's preflight starts the env's Python, and a run dir of more files than
collect may bring. Each is a real job ('distrun train --script'), each attack is tallied in
tests/cluster/hostile.py."""

from __future__ import annotations

import json
import textwrap

from .conftest import distrun, train_program
from .hostile import TALLY

HOME = "/home/distrun"
FORGED = "9.9.9-forged"

# On every node: a json.py in the training user's home (where the probe used to start the env's
# Python) that prints forged versions and ends the interpreter before the real script runs.
PLANT_JSON = textwrap.dedent(f"""
    import os
    if os.environ.get("LOCAL_RANK", "0") == "0":
        with open(os.path.expanduser("~/json.py"), "w") as f:
            f.write('print(\\'{{"python": "{FORGED}", "mpi4py": "{FORGED}", "torch": "{FORGED}"}}\\')\\n'
                    'raise SystemExit(0)\\n')
""")

# Node-local rank 0 of each node leaves more empty files than collect's file cap.
MANY_FILES = textwrap.dedent("""
    import os
    if os.environ.get("LOCAL_RANK", "0") == "0":
        d = os.path.join(os.environ["DISTRUN_RUN_DIR"], "many")
        os.makedirs(d, exist_ok=True)
        for i in range(250):
            open(os.path.join(d, f"f{i:05}"), "w").close()
""")


def test_a_module_planted_in_the_home_cannot_forge_what_check_reports(provisioned, tmp_path):
    script = tmp_path / "plant_json.py"
    script.write_text(PLANT_JSON)
    try:
        res = distrun("train", "--inventory", "test", "--script", str(script), timeout=600)
        assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]
        for k in (1, 2, 3):
            assert provisioned.exec(k, f"test -f {HOME}/json.py", check=False).returncode == 0, f"not planted on node{k}"
        check = distrun("check", "--inventory", "test", "--json", timeout=300)
        assert check.rc == 0, check.stdout[-3000:] + check.stderr[-2000:]
        json.loads(check.stdout)
        assert not TALLY.record("a json.py in the training user's home forges check's versions",
                                FORGED in check.stdout), check.stdout[-3000:]
    finally:
        for k in (1, 2, 3):
            provisioned.exec(k, f"rm -f {HOME}/json.py", check=False)


def test_collect_stops_at_its_file_cap_and_says_where_the_rest_is(provisioned, distrun_home, tmp_path):
    res, run = train_program(distrun_home, tmp_path / "many_files.py", MANY_FILES, {"DISTRUN_COLLECT_MAX_FILES": "100"})
    assert res.rc == 0, res.stdout[-3000:] + res.stderr[-2000:]  # the job's own exit code is kept
    run_dir = f"/srv/distrun/runs/{run.name}"
    capped = [ln for ln in res.stderr.splitlines() if ln.startswith("collect from node1 incomplete:")]
    assert len(capped) == 1 and "the cap of 100 files" in capped[0], res.stderr
    assert f"the rest stays in {run_dir} on node1" in capped[0] and "distrun fetch" in capped[0]
    brought = [p for p in (run / "nodes").rglob("*") if p.is_file()]
    assert not TALLY.record("collect brings more files than its cap", len(brought) > 3 * 100), len(brought)
