"""An attempt's state machine (distrun.run.attempt): its transition table, the events that move
it, what the record keeps."""

from __future__ import annotations

import json
import time

import pytest

from distrun.errors import ExitCode
from distrun.run.attempt import NEXT, ORDER, Attempt, End, Step


def test_the_table_names_every_state_and_nothing_follows_an_end():
    assert set(NEXT) == set(ORDER) == {*Step, *End}
    for end in End:
        assert NEXT[end] == frozenset(), f"{end} is an end: nothing may follow it"
    for step in Step:
        assert NEXT[step], f"{step} leads nowhere"


def test_launched_comes_only_right_after_staged_and_staged_only_once_planned():
    before_launch = {s for s, nxt in NEXT.items() if End.LAUNCHED in nxt or End.LAUNCH_FAILED in nxt}
    assert before_launch == {Step.STAGED}
    assert NEXT[Step.STAGED] == {End.LAUNCHED, End.LAUNCH_FAILED, End.INTERRUPTED}
    assert not any(s in NEXT[x] for x in NEXT for s in (Step.PLANNED,)), "nothing leads back to planned"


def test_every_state_is_reached_from_planned_and_leads_to_an_end():
    def reachable(start):
        seen, todo = set(), [start]
        while todo:
            for n in NEXT[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    assert reachable(Step.PLANNED) == set(ORDER) - {Step.PLANNED}
    for step in Step:
        assert reachable(step) & set(End), f"{step} leads to no end"


@pytest.mark.parametrize("events", [
    ["launched"],  # no launch without staged
    ["judged", "launch_failed"],
])
def test_no_launch_is_recorded_without_staged(events):
    a = Attempt(0)
    for e in events:
        recorded = getattr(a, e)("why") if e == "launch_failed" else getattr(a, e)()
        assert recorded == (e == "judged"), e
    assert a.end is None and not a.reached(End.LAUNCHED)


def test_an_attempt_keeps_each_state_once_in_the_order_reached_and_its_first_end():
    a = Attempt(2)
    assert a.uploaded(at=0.0)  # answered as the attempt was planned: time 0
    assert a.judged() and not a.judged()
    assert a.claim_answered()
    assert a.staged()
    assert a.launch_failed("node3: no pid file after 60 s")
    assert not a.launched() and not a.interrupted()  # after an end: nothing is recorded
    d = json.loads(a.to_json())
    assert [s["state"] for s in d["states"]] == ["planned", "uploaded", "judged", "claimed", "staged", "launch failed"]
    times = [s["s"] for s in d["states"]]
    assert times == sorted(times) and times[:2] == [0.0, 0.0]
    assert d["attempt"] == 2 and d["end"] == "launch failed" and d["why"] == "node3: no pid file after 60 s"
    assert a.end is End.LAUNCH_FAILED and a.exit_code == ExitCode.LAUNCH and not a.reached(End.LAUNCHED)


def test_news_after_the_end_is_not_recorded():
    """A thread that lost the race (the upload's answer after the run was interrupted) changes nothing."""
    a = Attempt(0)
    assert a.interrupted("stopped by 'distrun stop'")
    assert not a.uploaded(at=time.monotonic()) and not a.claim_answered() and not a.staged()
    d = json.loads(a.to_json())
    assert [s["state"] for s in d["states"]] == ["planned", "interrupted"] and d["why"] == "stopped by 'distrun stop'"


def test_a_refusal_keeps_its_own_exit_code():
    a = Attempt(0)
    assert a.claim_answered()
    assert a.refused("node1 is busy with run R", ExitCode.BUSY)
    assert (a.end, a.exit_code) == (End.REFUSED, ExitCode.BUSY)
    b = Attempt(0)
    b.refused("preflight failed on node2")
    assert b.exit_code == ExitCode.PREFLIGHT


def test_an_attempt_without_an_end_says_so():
    d = json.loads(Attempt(0).to_json())
    assert d == {"attempt": 0, "states": [{"state": "planned", "s": 0.0}], "end": None, "why": ""}
