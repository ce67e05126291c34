"""The all-reduce check without a cluster: the program's sizes, bus factor and pair rounds; its
result read back defensively; the node or pair named; nccl-tests' table and the verdict lines."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest

from distrun.errors import UserError
from distrun.preflight import bandwidth as bw
from distrun.ui.bandwidth import pair_lines, table, verdict_lines
from tests.harness.modules import load_file

REPO = Path(__file__).resolve().parents[2]


def program():  # noqa: ANN201
    return load_file(REPO / "workloads" / bw.PROGRAM, "allreduce_bw_under_test")


prog = program()


def test_the_program_imports_no_torch_until_it_runs():
    assert "torch" not in vars(prog)


@pytest.mark.parametrize("text,expected", [("1024", 1024), ("64K", 65536), ("16M", 16 << 20), ("1G", 1 << 30),
                                           ("4mb", 4 << 20)])
def test_sizes_are_read_like_nccl_tests(text, expected):
    assert prog.size_bytes(text) == expected


@pytest.mark.parametrize("text", ["0", "-4", "4X", "M", ""])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="is not a size"):
        prog.size_bytes(text)


def test_message_sizes_go_from_min_to_max_by_the_factor_in_whole_elements():
    assert prog.sizes(1024, 16 << 20, 4, 4) == [1024 << (2 * i) for i in range(8)]
    assert prog.sizes(1000, 5000, 2, 4) == [1000, 2000, 4000, 5000]  # max kept when the factor skips it
    assert prog.sizes(2, 2, 2, 4) == [4]  # at least one element


@pytest.mark.parametrize("ranks,factor", [(1, 0.0), (2, 1.0), (3, 4 / 3), (8, 1.75)])
def test_the_bus_factor_is_nccl_tests_all_reduce_one(ranks, factor):
    assert prog.bus_factor(ranks) == pytest.approx(factor)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
def test_rounds_hold_every_pair_once_and_no_node_twice_in_a_round(n):
    nodes = [f"n{i}" for i in range(n)]
    schedule = prog.rounds(nodes)
    pairs = [p for r in schedule for p in r]
    assert sorted(pairs) == sorted(itertools.combinations(nodes, 2))
    assert all(len({h for p in r for h in p}) == 2 * len(r) for r in schedule)
    assert len(schedule) == (n - 1 if n % 2 == 0 else n)


def test_bad_flags_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        prog.parse_args(["--min-bytes", "1M", "--max-bytes", "1K"])
    assert exc.value.code == 2 and "--min-bytes 1048576 is above --max-bytes 1024" in capsys.readouterr().err


# -- the result read back and judged

RESULT: dict[str, Any] = {
    "workload": "allreduce_bw", "backend": "gloo", "device": "cpu", "ranks": 3, "dtype": "float32", "type": "float",
    "redop": "sum", "iters": 10, "warmup": 3, "hosts": ["node1", "node2", "node3"],
    "ranks_per_host": {"node1": 1, "node2": 1, "node3": 1}, "nics": {"node1": "eth0", "node2": "eth0", "node3": "eth0"},
    "sizes": [{"bytes": 1024, "count": 256, "time_us": 812.5, "algbw": 0.00126, "busbw": 0.00168, "wrong": 0},
              {"bytes": 4194304, "count": 1048576, "time_us": 6012.25, "algbw": 0.6976, "busbw": 0.9302, "wrong": 0}],
    "pair_bytes": 4194304,
    "pairs": [{"hosts": ["node1", "node2"], "ranks": 2, "time_us": 4100.0, "algbw": 1.023, "busbw": 1.023},
              {"hosts": ["node1", "node3"], "ranks": 2, "time_us": 4500.0, "algbw": 0.932, "busbw": 0.932},
              {"hosts": ["node2", "node3"], "ranks": 2, "time_us": 5200.0, "algbw": 0.807, "busbw": 0.807}],
}
NODES = ["node1", "node2", "node3"]


def with_pairs(*busbw: float, hosts: list[str] | None = None) -> dict:
    r = copy.deepcopy(RESULT)
    hosts = hosts or NODES
    r["hosts"] = hosts
    r["pairs"] = [{"hosts": list(p), "ranks": 2, "time_us": 4194304 / b / 1000, "algbw": b, "busbw": b}
                  for p, b in zip(itertools.combinations(hosts, 2), busbw, strict=True)]
    return r


def test_pairs_within_a_factor_of_two_name_nothing():
    # The usual pair: the median over the nodes of each node's best pair (node1 1.023, node2 1.023, node3 0.932).
    v = bw.judge(bw.read(RESULT, NODES))
    assert v.ok and v.reference == pytest.approx(1.023) and not v.slow_nodes and not v.slow_pairs


def test_a_node_slow_with_everyone_is_named_not_its_pairs():
    v = bw.judge(bw.read(with_pairs(1.02, 0.011, 0.012), NODES))
    assert dict(v.slow_nodes) == {"node3": pytest.approx(0.012)} and not v.slow_pairs and not v.ok
    assert v.reference == pytest.approx(1.02)


def test_one_slow_link_between_two_good_nodes_names_the_pair():
    four = ["a", "b", "c", "d"]
    # a-b a-c a-d b-c b-d c-d: only b - d is slow; b and d are fast with the others.
    v = bw.judge(bw.read(with_pairs(1.0, 0.9, 1.1, 0.95, 0.1, 1.05, hosts=four), four))
    assert not v.slow_nodes and dict(v.slow_pairs) == {("b", "d"): pytest.approx(0.1)}


def test_two_nodes_are_one_pair_and_nothing_to_compare_it_with():
    v = bw.judge(bw.read(with_pairs(0.01, hosts=["node1", "node2"]), NODES))
    assert v.ok and v.reference is None and v.note.startswith("two nodes make one pair")


def test_a_wrong_sum_fails_the_check():
    r = copy.deepcopy(RESULT)
    r["sizes"][1]["wrong"] = 5
    v = bw.judge(bw.read(r, NODES))
    assert not v.ok and v.wrong == 5
    assert bw.problems(bw.read(r, NODES), v)[-1][0] == "5 element(s) of the all-reduce results were wrong"


@pytest.mark.parametrize("change,said", [
    (lambda r: r.update(workload="gcn_ddp"), "the run printed no all-reduce result"),
    (lambda r: r.update(hosts=["node1", "elsewhere"]), "hosts ['node1', 'elsewhere'] are not the run's nodes"),
    (lambda r: r["sizes"][0].update(busbw="fast"), "sizes: busbw is 'fast', not a number >= 0"),
    (lambda r: r["sizes"][0].update(time_us=float("nan")), "sizes: time_us is nan"),
    (lambda r: r["pairs"][0].update(hosts=["node1", "node1"]), "pair ['node1', 'node1'] is not two of the measured hosts"),
    (lambda r: r.update(nics={"node1": "eth0\x1b[2J"}), "nics: 'eth0\\x1b[2J' is not a name"),
    (lambda r: r.update(sizes="many"), "sizes is not a list of objects"),
])
def test_a_result_that_is_not_the_programs_is_one_line(change, said):
    r = copy.deepcopy(RESULT)
    change(r)
    with pytest.raises(UserError) as exc:
        bw.read(r, NODES)
    assert said in str(exc.value) and str(exc.value).startswith("the all-reduce check's result cannot be read: ")
    assert str(exc.value).endswith("see the run's launcher log ('distrun logs last')")


# -- what is shown


def test_the_table_is_nccl_tests_layout_with_one_row_per_size():
    lines = table(bw.read(RESULT, NODES))
    assert lines[0] == "# all-reduce (sum, in place): 3 rank(s) on 3 node(s) (node1, node2, node3), gloo on cpu over eth0"
    assert lines[1] == "#       size         count      type   redop     time   algbw   busbw #wrong"
    assert lines[2].rstrip() == "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)"
    assert lines[3] == "        1024           256     float     sum   812.50    0.00    0.00      0"
    assert lines[4] == "     4194304       1048576     float     sum  6012.25    0.70    0.93      0"
    # The columns line up under the header's (nccl-tests' widths).
    for col in ("size", "count", "type", "redop", "time", "algbw", "busbw"):
        end = lines[1].index(col) + len(col)
        assert lines[3][end - 1] != " " and lines[4][end - 1] != " ", col
    assert lines[5] == "# Avg bus bandwidth    : 0.466 GB/s"


def test_pairs_and_the_verdict_name_the_slow_node_with_its_fix():
    m = bw.read(with_pairs(1.02, 0.011, 0.012), NODES)
    v = bw.judge(m)
    assert pair_lines(m, v) == [
        "# node pairs: 4194304 bytes per all-reduce, disjoint pairs at once",
        "  node1 - node2  4112.06 us     1.020 GB/s  ok",
        f"  node1 - node3  {4194304 / 0.011 / 1000:7.0f} us     0.011 GB/s  FAR BELOW",
        f"  node2 - node3  {4194304 / 0.012 / 1000:7.0f} us     0.012 GB/s  FAR BELOW"]
    assert verdict_lines(m, v) == [
        "✗ node3: bus bandwidth 0.012 GB/s over eth0 at best, far below the other nodes' 1.020 GB/s (4194304 bytes per "
        "all-reduce, every pair node3 is in)",
        "    fix: look at node3's NIC over eth0: its link speed and errors (ethtool), a traffic shaper (tc qdisc), its "
        "cable or switch port; 'distrun train --exclude node3' runs without it meanwhile"]


def test_the_verdict_when_all_is_well_or_nothing_compares():
    m = bw.read(RESULT, NODES)
    assert verdict_lines(m, bw.judge(m)) == [
        "no node or pair far below the rest (every pair at least half of the usual 1.023 GB/s)"]
    two = bw.read(with_pairs(0.5, hosts=["node1", "node2"]), NODES)
    assert verdict_lines(two, bw.judge(two))[0].startswith("no node named: two nodes make one pair")


def test_the_json_has_the_table_pairs_and_verdict():
    m = bw.read(with_pairs(1.02, 0.011, 0.012), NODES)
    out = bw.as_json(m, bw.judge(m), "20251103-train-x")
    assert out["ok"] is False and out["run_id"] == "20251103-train-x" and out["slow_nodes"] == {"node3": 0.012}
    assert out["sizes"][0] == RESULT["sizes"][0] and out["pairs"][0]["hosts"] == ["node1", "node2"]
    assert out["problems"][0]["detail"].startswith("node3: bus bandwidth 0.012 GB/s")


def test_checks_exit_code_is_the_runs_else_the_verdicts():
    from distrun.preflight.allreduce import Outcome

    m = bw.read(RESULT, NODES)
    assert Outcome(3, "r", None).exit_code == 3
    assert Outcome(0, "r", None, m, bw.judge(m)).exit_code == 0
    slow = bw.read(with_pairs(1.0, 0.01, 0.01), NODES)
    assert Outcome(0, "r", None, slow, bw.judge(slow)).exit_code == 1


def test_the_program_is_started_as_train_starts_a_script(monkeypatch, tmp_path):
    """check --bandwidth builds the same JobRequest 'train --script' does, and reads what the run recorded."""
    import json

    from distrun.preflight import allreduce
    from distrun.run.listener import Listener

    seen = {}

    class View(Listener):
        run: Any = None

    def fake_run_job(request, listener):  # noqa: ANN001,ANN202
        seen["request"] = request
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "result.json").write_text(json.dumps(with_pairs(1.0, 0.01, 0.01)))
        (run_dir / "plan.json").write_text((REPO / "tests/unit/data/plans/slurm-site-login.json").read_text())
        listener.run = type("R", (), {"id": "r1", "dir": run_dir})()
        return 0

    monkeypatch.setattr("distrun.run.train.run_job", fake_run_job)
    monkeypatch.setattr("distrun.preflight.allreduce.read",
                        lambda result, nodes: seen.update(nodes=nodes) or bw.read(result, NODES))
    out = allreduce.measure(Path("/inv"), "torchrun", View(), "4194304")
    req = seen["request"]
    assert (req.launch.launcher, req.program.script, req.program.args) == \
        ("torchrun", allreduce.program(), ("--max-bytes", "4194304"))
    assert req.program.script.name == "allreduce_bw.py" and req.program.script.is_file()
    assert req.policy.preflight and not req.policy.allow_concurrent
    # The hosts a result may name are the recorded plan's (that plan: a site's Slurm, its compute nodes).
    from distrun.planning.jobplan import from_json
    plan = from_json(json.loads((tmp_path / "run" / "plan.json").read_text()))
    assert seen["nodes"] == [h.name for h in plan.placement.hosts]
    assert out.verdict is not None and list(out.verdict.slow_nodes) == ["node3"]
    assert out.run_id == "r1" and out.exit_code == 1


def test_the_json_keys_are_the_published_schemas():
    import json

    schema = json.loads((REPO / "docs" / "guide" / "distrun-json.schema.json").read_text())["$defs"]["bandwidth"]
    m = bw.read(with_pairs(1.02, 0.011, 0.012), NODES)
    out = bw.as_json(m, bw.judge(m), "r")
    assert set(out) == set(schema["properties"]) and set(schema["required"]) <= set(out)
    assert set(out["sizes"][0]) == set(schema["properties"]["sizes"]["items"]["required"])
