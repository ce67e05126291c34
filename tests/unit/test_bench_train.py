"""The strong-scaling section's tables and summary rows per graph shape (bench/train.py's render,
bench/run_all.py's workload rows): one table and one verdict per shape and workload."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.harness.modules import load_file

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


def _load(name: str):  # noqa: ANN202
    return load_file(BENCH / f"{name}.py", f"bench_{name}")


train = _load("train")
run_all = _load("run_all")


def _row(workload: str, shape: str, label: str, ranks: int, epoch_s: float, speedup: float) -> dict:
    prof = [{"rank": r, "epoch_s": epoch_s, "compute_s": epoch_s * 0.9, "comm_s": epoch_s * 0.1,
             "halo_bytes": 2**20, "allreduce_bytes": 1024} for r in range(ranks)]
    return {"workload": workload, "shape": shape, "label": label, "ranks": ranks, "epoch_s": epoch_s,
            "speedup": speedup, "ranks_profile": prof, "test_acc": 0.5, "load_1min": 1.2}


ROWS = [_row("gcn_torch", "narrow", "1 rank x 1 thread", 1, 0.2, 1.0),
        _row("gcn_torch", "narrow", "2 ranks x 1 thread", 2, 0.1, 2.0),
        _row("gcn_torch", "wide", "1 rank x 1 thread", 1, 1.0, 1.0),
        _row("gcn_torch", "wide", "2 ranks x 1 thread", 2, 0.625, 1.6)]
DATA = {"shapes": {"narrow": dict(train.SHAPES["narrow"], edges_directed=1_018_778),
                   "wide": dict(train.SHAPES["wide"], edges_directed=1_019_696)},
        "repeats": 3, "machine": {"cpus": 2},
        "rows": ROWS}


def test_each_shape_has_its_table_and_verdict():
    text = "\n".join(train.render(DATA))
    assert "### narrow: synthetic graph 50,000 nodes / 1,018,778 directed edges / 64 features" in text
    assert "Â·X first" in text and "X·W1 first" in text
    assert "gcn_torch, narrow: 2.00 at load 1.2 — **met**" in text
    assert "gcn_torch, wide: 1.60 at load 1.2 — **not met**" in text


def test_the_summary_has_one_row_per_shape_and_workload():
    rows = run_all.workload_rows(DATA)
    scaling = [r for r in rows if r.startswith("| gcn_torch epoch")]
    assert len(scaling) == 2
    assert "narrow graph (50,000 nodes, 64 features, hidden 64)" in scaling[0] and "| met (load 1.2) |" in scaling[0]
    assert "wide graph (100,000 nodes, 256 features, hidden 64)" in scaling[1] and "not met" in scaling[1]


def test_a_result_from_before_shapes_still_renders_as_one_table():
    old = {"graph": {"nodes": 50_000, "edges": 1_000_000, "features": 64, "hidden": 64, "classes": 8},
           "epochs": 20, "edges": 1_018_778, "repeats": 3,
           "rows": [{k: v for k, v in r.items() if k != "shape"} for r in ROWS[:2]]}
    text = "\n".join(train.render(old))
    assert text.count("| workload | configuration |") == 1 and "gcn_torch: 2.00" in text
    assert len([r for r in run_all.workload_rows(old) if r.startswith("| gcn_torch epoch")]) == 1


def test_a_row_is_its_fastest_run_with_the_medians_beside_it_and_a_failed_run_fails_the_row():
    runs = [dict(ROWS[1], epoch_s=e) for e in (0.14, 0.10, 0.18)]
    row = train.fastest_run(runs)
    assert row["epoch_s"] == 0.10 and row["median_epoch_s"] == 0.14 and row["runs_epoch_s"] == [0.14, 0.10, 0.18]
    failed = train.fastest_run([*runs[:2], {k: v for k, v in ROWS[1].items() if k != "epoch_s"} | {"error": "rc 1"}])
    assert failed.get("epoch_s") is None and "median_epoch_s" not in failed and failed["runs_epoch_s"][2] is None
    data = dict(DATA, rows=[dict(ROWS[0], median_epoch_s=0.3, median_speedup=1.0),
                            dict(ROWS[1], median_epoch_s=0.2, median_speedup=1.5)])
    text = "\n".join(train.render(data))
    assert "its row is its fastest run" in text
    assert "gcn_torch, narrow: 2.00 (of the medians: 1.50) at load 1.2 — **met**" in text
