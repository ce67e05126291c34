"""Role slurm's cancel step runs as root on the head: it cancels the training user's jobs of the
run's name, never another user's job that took the same name (anyone may name a job
distrun-<run id>). The step's shell runs for real against squeue and scancel stand-ins that keep
a queue of two users' jobs."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[2]

SQUEUE = """#!/usr/bin/env python3
import json, sys
queue = json.load(open(sys.argv[0] + ".queue"))
user = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--user=")), None)
for job in queue:
    if user is None or job["user"] == user:
        print(job["id"], job["name"])
"""
SCANCEL = """#!/usr/bin/env python3
import json, os, sys
state = os.path.join(os.path.dirname(sys.argv[0]), "squeue.queue")
queue = json.load(open(state))
user = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--user=")), None)
ids = [a for a in sys.argv[1:] if not a.startswith("-")]
json.dump([j for j in queue if not (j["id"] in ids and (user is None or j["user"] == user))], open(state, "w"))
"""


def _cancel_script(run_id: str, user: str) -> str:
    tasks = yaml.safe_load((REPO / "roles" / "slurm" / "tasks" / "cancel.yml").read_text())
    [task] = [t for t in tasks if "ansible.builtin.shell" in t]
    env = jinja2.Environment()
    env.filters["quote"] = lambda s: shlex.quote(str(s))
    return env.from_string(task["ansible.builtin.shell"]["cmd"]).render(slurm_cancel_run_id=run_id,
                                                                          slurm_cancel_user=user)


def test_cancel_leaves_another_users_job_of_the_same_name(tmp_path):
    for name, text in (("squeue", SQUEUE), ("scancel", SCANCEL)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    queue = [{"id": "11", "name": "distrun-r1", "user": "distrun"},
             {"id": "12", "name": "distrun-r1-2", "user": "distrun"},
             {"id": "13", "name": "distrun-r1", "user": "mallory"},
             {"id": "14", "name": "other", "user": "distrun"}]
    (tmp_path / "squeue.queue").write_text(json.dumps(queue))
    out = subprocess.run(["bash", "-c", _cancel_script("r1", "distrun")], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "2"
    left = [j["id"] for j in json.loads((tmp_path / "squeue.queue").read_text())]
    assert left == ["13", "14"]


def test_only_a_launcher_with_a_cancel_step_names_one_and_stop_yml_names_no_launcher():
    """Slurm's cancel is its launcher's: the stop play runs the role a plan's launcher names
    (Launcher.cancel), and names no launcher itself."""
    from distrun.launchers import LAUNCHERS
    from distrun.run.stop import stop_vars

    from .plans import plan_for
    from .test_slurm import ENABLED, cluster

    plan = plan_for(cluster(**ENABLED), run_id="r1", launcher="slurm")
    assert stop_vars("r1", plan) == {"distrun_run_id": "r1", "distrun_cancel_role": "slurm", "slurm_cancel_run_id": "r1"}
    assert stop_vars("r1", plan_for(cluster(**ENABLED), run_id="r1", launcher="mpirun")) == {"distrun_run_id": "r1"}
    play = (REPO / "playbooks" / "stop.yml").read_text()
    assert not [name for name in LAUNCHERS if name in play.lower()]
    cancel = yaml.safe_load(play)[0]["tasks"][0]["ansible.builtin.include_role"]
    assert cancel == {"name": "{{ distrun_cancel_role }}", "tasks_from": "cancel"}
