"""scripts/gpu-check's plan, verdicts and table, without a GPU (no GPU run is tested here: the
script's own runs need a machine with CUDA, and docs/benchmarks.md says where they have not run)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check"


def load() -> Any:
    loader = importlib.machinery.SourceFileLoader("gpu_check_under_test", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while the file runs
    loader.exec_module(module)
    return module


gc = load()


def nproc(cmd: list[str]) -> int:
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"], cmd
    return int(cmd[4].removeprefix("--nproc-per-node="))


@pytest.mark.parametrize("gpus,ranks", [(0, []), (1, [1]), (2, [1, 2]), (8, [1, 2, 8])])
def test_rank_counts_are_one_two_and_every_gpu(gpus: int, ranks: list[int]) -> None:
    assert gc.rank_counts(gpus) == ranks


def test_no_gpu_plans_nothing(tmp_path: Path) -> None:
    assert gc.plan(0, "py", tmp_path / "cora", tmp_path, have_metis=True) == []


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_every_program_at_every_rank_count_under_torchrun(gpus: int, tmp_path: Path) -> None:
    cora = tmp_path / "cora"
    steps = gc.plan(gpus, "py", cora, tmp_path, have_metis=True, only=("gcn", "ddp", "nccl"))
    configs = ["gcn_torch exact (cora)", "gcn_ddp exact (cora)", "gcn_torch accuracy (cora)",
               "gcn_ddp accuracy (cora)", "ddp_minimal", "nccl all-reduce"]
    assert [(s.config, s.ranks) for s in steps] == [(c, n) for n in gc.rank_counts(gpus) for c in configs]
    for s in steps:
        assert nproc(s.cmd) == s.ranks and not s.skip
        assert Path(s.cmd[5]).name in ("gcn_torch.py", "gcn_ddp.py", "ddp_minimal.py", "allreduce_bw.py")
        if "gcn" in s.config:
            assert s.cmd[6:10] == ["--dataset", "cora", "--data-dir", str(cora)]
        if s.config.startswith("gcn_torch"):
            # partitioned into as many parts as ranks, by partition.py first
            part_dir = tmp_path / "parts" / f"cora-{s.ranks}"
            assert s.cmd[s.cmd.index("--num-parts") + 1] == str(s.ranks)
            assert s.cmd[s.cmd.index("--part-dir") + 1] == str(part_dir)
            assert s.prep is not None and Path(s.prep[1]).name == "partition.py"
            assert s.prep[-4:] == ["--num-parts", str(s.ranks), "--out", str(part_dir)]
        else:
            assert s.prep is None
        if s.kind == "exact":
            assert s.npz is not None and s.cmd[-2:] == ["--check-exact", str(s.npz)] and "--seed" in s.cmd
    assert len({s.npz for s in steps if s.npz}) == 2 * len(gc.rank_counts(gpus))  # no run overwrites another's


def test_without_cora_the_exact_rows_use_a_generated_graph_and_accuracy_is_skipped(tmp_path: Path) -> None:
    steps = gc.plan(2, "py", None, tmp_path, have_metis=True)
    exact = [s for s in steps if s.kind == "exact"]
    assert exact and all("synthetic" in s.config and s.cmd[6:8] == ["--dataset", "synthetic"] and not s.skip
                         for s in exact)
    accuracy = [s for s in steps if s.kind == "accuracy"]
    assert len(accuracy) == 4 and all(s.skip.startswith("Cora not found: pass --cora DIR") for s in accuracy)


def test_without_pymetis_only_multi_part_partitions_are_skipped_unless_given(tmp_path: Path) -> None:
    steps = gc.plan(2, "py", tmp_path / "cora", tmp_path / "work", have_metis=False)
    skipped = {(s.config, s.ranks) for s in steps if s.skip}
    assert skipped == {("gcn_torch exact (cora)", 2), ("gcn_torch accuracy (cora)", 2)}
    assert all("pymetis is not installed: pass --parts DIR" in s.skip for s in steps if s.skip)
    ready = tmp_path / "ready" / "cora-2"
    ready.mkdir(parents=True)
    (ready / "manifest.json").write_text("{}")
    steps = gc.plan(2, "py", tmp_path / "cora", tmp_path / "work", have_metis=False, parts=tmp_path / "ready")
    torch2 = [s for s in steps if s.config.startswith("gcn_torch") and s.ranks == 2]
    assert all(not s.skip and s.prep is None and s.cmd[s.cmd.index("--part-dir") + 1] == str(ready) for s in torch2)


@pytest.mark.parametrize("kind,number,expected", [
    ("exact", (3e-7, 2e-6), "pass"),
    ("exact", (2e-5, 2e-6), "FAIL"),  # absolute bound of the CPU tests
    ("exact", (3e-7, 5e-4), "FAIL"),  # relative bound
    ("accuracy", 0.812, "pass"),
    ("accuracy", 0.795, "pass"),
    ("accuracy", 0.79, "FAIL"),
    ("ddp", (0.57, 0.38), "pass"),
    ("ddp", (0.57, 0.60), "FAIL"),
])
def test_verdicts_from_given_numbers(kind: str, number: object, expected: str) -> None:
    assert gc.verdict(kind, number) == expected


def test_the_table_has_one_row_per_run_and_the_six_columns() -> None:
    rows = [("gcn_torch exact (cora)", 1, "NVIDIA H100 (cuda, nccl)", None, gc.show("exact", (3e-7, 2e-6)), "pass"),
            ("gcn_ddp accuracy (cora)", 2, "NVIDIA H100 (cuda, nccl)", 0.00412, gc.show("accuracy", 0.81), "pass"),
            ("gcn_torch accuracy (cora)", 2, "NVIDIA H100 (cuda, nccl)", None, "Cora not found", "skip")]
    lines = gc.table(rows).splitlines()
    assert lines[0] == "| configuration | ranks | device | epoch time | checked number | verdict |"
    assert len(lines) == 2 + len(rows) and all(ln.count("|") == 7 for ln in lines)
    assert lines[2] == "| gcn_torch exact (cora) | 1 | NVIDIA H100 (cuda, nccl) | — | max error abs 3.0e-07, rel 2.0e-06 | pass |"
    assert lines[3] == "| gcn_ddp accuracy (cora) | 2 | NVIDIA H100 (cuda, nccl) | 4.1 ms | test accuracy 0.810 (>= 0.795) | pass |"
    assert lines[4].endswith("| — | Cora not found | skip |")


def test_refusal_names_what_is_missing() -> None:
    assert "torch is not installed" in gc.refusal(None)
    no_cuda = SimpleNamespace(__version__="2.9.0+cpu", cuda=SimpleNamespace(is_available=lambda: False))
    assert gc.refusal(no_cuda).startswith("gpu-check: torch 2.9.0+cpu sees no CUDA GPU")
    assert gc.refusal(SimpleNamespace(__version__="2.9.0", cuda=SimpleNamespace(is_available=lambda: True))) is None


def test_without_cuda_it_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    """The script itself, with a torch that sees no GPU: a stand-in module on its path, so the
    test means the same on a machine that has one."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.0+stand-in'\nclass cuda:\n"
                                      "    @staticmethod\n    def is_available():\n        return False\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "gpu-check: torch 0.0+stand-in sees no CUDA GPU (torch.cuda.is_available() is False): run this on a "
        "machine with NVIDIA GPUs and a CUDA build of torch"]
    assert not (tmp_path / "out").exists()


def test_the_script_is_executable_and_reads_only_the_standard_library_at_import() -> None:
    assert SCRIPT.stat().st_mode & 0o111
    assert isinstance(gc, ModuleType) and "torch" not in vars(gc) and "numpy" not in vars(gc)


@pytest.mark.parametrize("device,verdict", [("cuda:0", "pass"), ("cpu", "FAIL"), (None, "FAIL")])
def test_a_program_that_computed_on_the_cpu_fails_its_row(tmp_path: Path, device: str | None,
                                                           verdict: str) -> None:
    """The device a program reports decides: a CUDA machine whose program fell back to the CPU
    (a wrong --backend, a torch without CUDA in the job's env) must not pass as a GPU check."""
    res = {"workload": "ddp_minimal", "ranks": 1, "loss": 0.2} | ({"device": device} if device else {})
    out = "".join(f'DISTRUN_EPOCH {{"epoch": {e}, "loss": {1.0 / e}}}\n' for e in range(1, gc.EPOCHS_DDP + 1))
    prog = tmp_path / "prog.py"
    prog.write_text(f"import sys\nsys.stdout.write({out!r})\nprint('DISTRUN_RESULT ' + {repr(__import__('json').dumps(res))})\n")
    step = gc.Step("ddp_minimal", "ddp", 1, [sys.executable, str(prog)])
    with open(tmp_path / "log.txt", "w") as log:
        _, number, result = gc.run(step, {"PATH": "/usr/bin:/bin"}, None, log)
    assert result == verdict, number
    if verdict == "FAIL":
        assert number == f"ran on {device or 'an unreported device'}, not a GPU"
    else:
        assert number == "loss 1.000 -> 0.200"


def test_an_exactness_run_is_judged_by_the_device_on_its_check_line(tmp_path: Path) -> None:
    """--check-exact runs print DISTRUN_CHECK (no DISTRUN_RESULT): the device is read there."""
    prog = tmp_path / "prog.py"
    prog.write_text("print('DISTRUN_CHECK {\"loss\": 1.9, \"path\": \"x.npz\", \"device\": \"cpu\"}')\n")
    step = gc.Step("gcn_torch exact (cora)", "exact", 1, [sys.executable, str(prog)], npz=tmp_path / "x.npz")
    with open(tmp_path / "log.txt", "w") as log:
        assert gc.run(step, {"PATH": "/usr/bin:/bin"}, None, log) == (None, "ran on cpu, not a GPU", "FAIL")


# -- the GPU-node paths: placement, NCCL all-reduce, the health read

DATA = REPO / "tests" / "unit" / "data" / "gpu"
H200 = {0: ("00000000:18:00.0", "GPU-6a2f0c1e-9b7d-4c52-8f3e-2d1a0b9c8e71")}


def test_one_gpu_plans_each_path_once_in_a_short_run(tmp_path: Path) -> None:
    """What a lent single-GPU machine runs with --only placement,nccl,health."""
    steps = gc.plan(1, "py", None, tmp_path, have_metis=False, only=("placement", "nccl", "health"))
    assert [(s.config, s.kind, s.ranks) for s in steps] == [
        ("nccl all-reduce", "nccl", 1), ("placement CUDA_VISIBLE_DEVICES=0", "placement", 1),
        ('placement CUDA_VISIBLE_DEVICES=""', "placement", 1), ("gpu health", "health", 0)]
    nccl, one, none, health = steps
    assert nccl.cmd[5].endswith("workloads/allreduce_bw.py") and nproc(nccl.cmd) == 1
    assert nccl.cmd[6:] == ["--backend", "nccl", "--max-bytes", "1G", "--pair-bytes", "0", "--result-file",
                            str(tmp_path / "allreduce-1.json")]
    assert one.env == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and one.gpus == (0,)
    assert none.env == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and none.gpus == ()
    assert one.cmd[5] == str(tmp_path / "placement_probe.py")
    assert health.cmd == ["py", str(REPO / "roles/preflight/files/gpuhealth.py")]


@pytest.mark.parametrize("gpus,expected", [
    (1, [(0,), ()]),
    (2, [(0, 1), (1, 0), ()]),
    (8, [tuple(range(8)), (7, 0), ()]),
])
def test_placements_are_every_gpu_one_out_of_order_and_none(gpus: int, expected: list) -> None:
    assert gc.selections(gpus) == expected
    for sel in expected:
        assert gc.visible_devices(sel)["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, sel))


def test_an_unknown_kind_is_refused_in_one_line() -> None:
    assert gc.only_kinds("placement, health") == ("placement", "health")
    with pytest.raises(Exception, match="'gpu': choose from gcn, ddp, placement, nccl, health"):
        gc.only_kinds("gpu")


def report(rank: int, local_rank: int, count: int, bus: str = "", uuid: str = "", total: float = 4.0) -> dict:
    return {"rank": rank, "local_rank": local_rank, "count": count, "bus": bus, "uuid": uuid, "sum": total}


def test_placement_passes_when_each_rank_is_on_the_gpu_its_index_names() -> None:
    smi = {i: (f"00000000:{0x18 + i:02X}:00.0", f"GPU-{i:08x}-0000-0000-0000-000000000000") for i in range(8)}
    reports = [report(0, 0, 2, bus="00000000:1F:00.0"), report(1, 1, 2, bus="00000000:18:00.0")]
    assert gc.placement_verdict((7, 0), reports, smi) == (
        "rank 0 on GPU 7 (00000000:1F:00.0); rank 1 on GPU 0 (00000000:18:00.0)", "pass")
    # torch names no bus id (older torch): the UUID decides, whatever way torch writes it.
    by_uuid = [report(0, 0, 1, uuid="00000007-0000-0000-0000-000000000000")]
    assert gc.placement_verdict((7,), by_uuid, smi)[1] == "pass"


@pytest.mark.parametrize("reports,said", [
    ([report(0, 0, 2, bus="00000000:18:00.0"), report(1, 1, 2, bus="00000000:1F:00.0")],
     "rank 0 is on 00000000:18:00.0, not GPU 7 (00000000:1F:00.0)"),
    ([report(0, 0, 8, bus="00000000:1F:00.0"), report(1, 1, 8, bus="00000000:18:00.0")],
     "rank 0 sees 8 GPU(s), given 2"),
    ([report(0, 0, 2, bus="00000000:1F:00.0")], "1 of 2 rank(s) reported"),
    ([report(0, 0, 2, bus="00000000:1F:00.0", total=0.0), report(1, 1, 2, bus="00000000:18:00.0")],
     "rank 0 is on 00000000:1F:00.0, not GPU 7"),
])
def test_placement_fails_naming_the_rank_that_is_elsewhere(reports: list, said: str) -> None:
    smi = {i: (f"00000000:{0x18 + i:02X}:00.0", "") for i in range(8)}
    text, verdict = gc.placement_verdict((7, 0), reports, smi)
    assert verdict == "FAIL" and text.startswith(said), text


def test_a_rank_given_no_gpu_must_see_none() -> None:
    assert gc.placement_verdict((), [report(0, 0, 0)], H200) == ("rank 0 sees none", "pass")
    assert gc.placement_verdict((), [report(0, 0, 1, bus="00000000:18:00.0")], H200) == (
        "rank 0 sees 1 GPU(s), given 0", "FAIL")


def test_nccl_passes_on_right_sums_and_says_the_largest_messages_bandwidth() -> None:
    sizes = [{"bytes": 1024, "algbw": 0.1, "busbw": 0.0, "wrong": 0},
             {"bytes": 1 << 30, "algbw": 1875.4, "busbw": 0.0, "wrong": 0}]
    assert gc.nccl_verdict({"backend": "nccl", "ranks": 1, "sizes": sizes}) == (
        "1073741824 B: algbw 1875.4 GB/s, busbw 0.0 GB/s (one rank: no bus)", "pass")
    sizes[0]["wrong"] = 3
    assert gc.nccl_verdict({"backend": "nccl", "ranks": 2, "sizes": sizes})[1] == "FAIL"
    assert gc.nccl_verdict({"backend": "gloo", "ranks": 1, "sizes": sizes}) == ("backend gloo, 2 size(s)", "FAIL")


def health_reading(query: str, devices: int) -> dict:
    return {"devices": devices, "smi": "/usr/bin/nvidia-smi", "now": 0.0, "boot": 0.0,
            "query": {"rc": 0, "out": (DATA / query).read_text(), "err": ""},
            "kernel": {"source": "", "lines": [], "error": "dmesg: read kernel buffer failed: Operation not permitted"}}


def test_the_health_row_is_the_checks_judgement_of_this_machine() -> None:
    assert gc.health_verdict(health_reading("query-gpu-8-healthy.csv", 8), 8) == (
        "8 GPU(s), driver 550.90.07; kernel log not read (dmesg: read kernel buffer failed: Operation not permitted)",
        "pass")
    text, verdict = gc.health_verdict(health_reading("query-gpu-one-lost.txt", 4), 4)
    assert verdict == "FAIL" and text == "would drain: GPU 0000:3A:00.0 does not answer (Unknown Error)"
    text, verdict = gc.health_verdict(health_reading("query-gpu-ecc-and-persistence.csv", 4), 4)
    assert verdict == "FAIL" and "uncorrected ECC error" in text
    assert gc.health_verdict({"devices": 0, "smi": "", "now": 0.0, "boot": 0.0}, 1) == (
        "no GPU read from nvidia-smi: 1 GPU(s) but no nvidia-smi", "FAIL")


def test_the_placement_and_health_steps_run_their_programs(tmp_path: Path) -> None:
    """The steps as gpu-check runs them, with stand-ins for torchrun's ranks and nvidia-smi."""
    prog = tmp_path / "probe.py"
    prog.write_text("import json, os\nprint('DISTRUN_PLACEMENT ' + json.dumps({'rank': 0, 'local_rank': 0, "
                    "'count': len([g for g in os.environ['CUDA_VISIBLE_DEVICES'].split(',') if g]), "
                    "'bus': '00000000:18:00.0', 'sum': 4.0, 'order': os.environ['CUDA_DEVICE_ORDER']}))\n")
    step = gc.Step("placement", "placement", 1, [sys.executable, str(prog)], env=gc.visible_devices((0,)), gpus=(0,))
    with open(tmp_path / "log.txt", "w") as log:
        assert gc.run(step, {"PATH": "/usr/bin:/bin"}, None, log, H200, 1) == (
            None, "rank 0 on GPU 0 (00000000:18:00.0)", "pass")
    assert "CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID" in (tmp_path / "log.txt").read_text()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "q.csv").write_text((DATA / "query-gpu-8-healthy.csv").read_text())
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncase \"$1\" in --query-gpu=*) cat {bin_dir}/q.csv;; esac\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    health = gc.plan(1, sys.executable, None, tmp_path, have_metis=False, only=("health",))[0]
    with open(tmp_path / "log.txt", "w") as log:
        _, number, verdict = gc.run(health, {"PATH": f"{bin_dir}:/usr/bin:/bin"}, None, log, {}, 8, tmp_path)
    assert verdict == "pass" and number.startswith("8 GPU(s), driver 550.90.07"), number
    kept = __import__("json").loads((tmp_path / "gpu-health.json").read_text())
    assert kept["query"]["out"] == (DATA / "query-gpu-8-healthy.csv").read_text()


def test_the_nccl_step_on_a_machine_without_a_gpu_fails_its_row(tmp_path: Path) -> None:
    """The real program under torchrun with this machine's CPU torch: it refuses NCCL in one line,
    so the row can never pass without a GPU. (An interpreter without torch, as the unit tests'
    newer Python has, fails the row earlier: torchrun itself is missing.)"""
    step = gc.plan(1, sys.executable, None, tmp_path, have_metis=False, only=("nccl",))[0]
    with open(tmp_path / "log.txt", "w") as log:
        _, number, verdict = gc.run(step, {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}, None, log)
    said = (tmp_path / "log.txt").read_text()
    assert verdict == "FAIL", number
    if importlib.util.find_spec("torch") is not None:
        assert "needs a GPU torch can see" in said, said[-2000:]
    else:
        assert "No module named 'torch'" in said, said[-2000:]
