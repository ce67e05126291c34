"""The run record layouts distrun still reads but no longer writes, each until ``READ_UNTIL``.

A run record on the controller (``DISTRUN_HOME/runs/<id>``: its plan.json and the files its run
brought home) outlives the distrun that wrote it, so a change of its layout is read both ways for
a while. Nothing else is: the node programs, what a run writes on the nodes and the caches are
read in today's layout only. Every such reading is listed here, once, with the code that does it
(``READERS``); the release ``READ_UNTIL`` removes them all, and tests/unit/test_retiring.py fails
once the package's version reaches it.
"""

from __future__ import annotations

READ_UNTIL = "0.2.0"

# plan.json keys under the name they once had, read as today's: the launcher's options were kept
# under the name of the first launcher that had any.
PLAN_KEYS_RENAMED = {"slurm": "launcher_options"}

# A plan.json without "attempt_dirs" is a run whose attempts wrote their launch scripts, pids,
# exit codes, markers and logs at the top of its run directory (a restart put the earlier
# attempt's aside in attempts/<n>/): its attempt's folder is the run directory itself.
ATTEMPT_DIRS_WHEN_MISSING = False

# The code that reads each form above (module under runner/distrun: name). In a collected copy,
# the last attempt's files at the top (a launcher-* file there) mark that layout, so a --script
# may not take such a name at the top of a run directory either (transport/rundir.RUN_DIR_PATTERNS).
READERS: dict[str, tuple[str, ...]] = {
    "PLAN_KEYS_RENAMED": ("planning/jobplan.py:from_json",),
    "ATTEMPT_DIRS_WHEN_MISSING": ("planning/jobplan.py:from_json", "run/logs.py:remote_log_command",
                                  "transport/rundir.py:collected_attempt", "transport/rundir.py:RUN_DIR_PATTERNS",
                                  "run/diagnosis.py:rank_logs"),
}
