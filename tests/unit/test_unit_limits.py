"""distrun_unit_limits: the resource limits the inventory gives a run's units on the nodes
(where an ssh login would have had the site's PAM limits). Checked at plan time, one line naming
the inventory and the fix; recorded in plan.json and sent to launch.py, which sets them
(tests/unit/test_attempt_program.py)."""

from __future__ import annotations

import json

import pytest

from distrun.errors import PlanError
from distrun.planning import limits
from distrun.planning.jobplan import from_json, to_json
from distrun.run.attempt_shell import launch_command

from .plans import plan_for
from .test_launchers import MIXED, cluster


def test_the_inventorys_limits_in_systemds_spelling():
    got = limits.from_inventory("i", {"distrun_unit_limits": {"nofile": 65536, "memlock": "unlimited", "stack": "8192:16384"}})
    assert got == (("memlock", "infinity"), ("nofile", "65536"), ("stack", "8192:16384"))
    assert limits.from_inventory("i", {}) == ()


@pytest.mark.parametrize(("given", "says"), [
    ({"nofiles": 10}, "inventory i: distrun_unit_limits: 'nofiles' is not a limit distrun sets; use as, core, data, "
                      "fsize, memlock, nofile, nproc, stack"),
    ({"nofile": -1}, "inventory i: distrun_unit_limits: nofile: -1 is not a limit; write a number, infinity, or SOFT:HARD"),
    ({"memlock": True}, "inventory i: distrun_unit_limits: memlock: True is not a limit; write a number, infinity, or SOFT:HARD"),
    ({"nofile": "1024:lots"}, "inventory i: distrun_unit_limits: nofile: '1024:lots' is not a limit; write a number, "
                              "infinity, or SOFT:HARD"),
    (["memlock=infinity"], "inventory i: distrun_unit_limits must be a mapping of limit names to values, e.g. "
                           "{memlock: infinity, nofile: 65536}"),
])
def test_a_wrong_limit_is_refused_in_one_line_naming_it(given, says):
    with pytest.raises(PlanError) as exc:
        limits.from_inventory("i", {"distrun_unit_limits": given})
    assert str(exc.value) == says


def test_a_plan_carries_them_to_every_launch_and_keeps_them_in_plan_json():
    plan = plan_for(cluster(MIXED, distrun_unit_limits={"memlock": "infinity"}), run_id="r1")
    assert plan.launch.unit_limits == (("memlock", "infinity"),)
    assert from_json(json.loads(json.dumps(to_json(plan)))) == plan
    sent = launch_command(plan, "n2")
    assert '"limits": [["memlock", "infinity"]]' in sent
    with pytest.raises(PlanError, match="distrun_unit_limits"):
        plan_for(cluster(MIXED, distrun_unit_limits={"memlock": "a lot"}), run_id="r1")
