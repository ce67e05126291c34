"""GPU health: nvidia-smi's CSV and the kernel log's Xid lines (samples in data/gpu, in the formats
nvidia-smi and the kernel write them) judged per node, with the fix and whether it drains; and
the node program that reads them, run here with stand-ins for nvidia-smi and journalctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from distrun.preflight import gpuhealth as gh

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "gpu"
PROGRAM = REPO / "roles" / "preflight" / "files" / "gpuhealth.py"
NOW = datetime.fromisoformat("2025-11-03T12:00:00+00:00").timestamp()
BOOT = datetime.fromisoformat("2025-11-02T08:14:50+00:00").timestamp()


def sample(name: str) -> str:
    return (DATA / name).read_text()


def reading(query: str = "query-gpu-8-healthy.csv", rc: int = 0, devices: int = 8, remap: str | None = None,
            kernel: str | None = None, now: float = NOW) -> dict:
    out = {"devices": devices, "smi": "/usr/bin/nvidia-smi", "now": now, "boot": BOOT,
           "query": {"rc": rc, "out": sample(query), "err": ""},
           "remap": {"rc": 0, "out": sample(remap) if remap else "gpu_bus_id, remapped_rows.uncorrectable, "
                     "remapped_rows.pending, remapped_rows.failure\n", "err": ""},
           "kernel": {"source": "journalctl -k -b -o short-iso", "lines": sample(kernel).splitlines() if kernel else [],
                      "error": ""}}
    return out


def test_the_query_csv_is_read_by_its_header():
    gpus, lost = gh.parse_query(sample("query-gpu-8-healthy.csv"))
    assert lost == [] and [g.index for g in gpus] == list(range(8))
    assert gpus[0] == gh.Gpu(0, "00000000:18:00.0", "NVIDIA H100 80GB HBM3", "550.90.07", True, 0, 0)
    assert gpus[7].ecc_aggregate == 2 and gpus[7].ecc_volatile == 0


def test_not_available_fields_read_as_unknown_not_as_errors():
    gpus, _ = gh.parse_query(sample("query-gpu-workstation-na.csv"))
    assert [(g.persistence, g.ecc_volatile, g.ecc_aggregate) for g in gpus] == [(True, None, None)] * 2


def test_a_gpu_nvidia_smi_cannot_reach_is_read_from_its_line():
    gpus, lost = gh.parse_query(sample("query-gpu-one-lost.txt"))
    assert [g.index for g in gpus] == [0, 1, 3]
    assert lost == [("0000:3A:00.0", "Unknown Error")]


def test_text_that_is_not_the_csv_is_refused():
    with pytest.raises(ValueError, match="not nvidia-smi's CSV"):
        gh.parse_query(sample("smi-no-driver.txt"))


def test_xids_from_the_journal_dmesg_and_dmesg_iso_with_their_ages():
    journal = gh.parse_xids(sample("journal-xid.txt").splitlines(), NOW, BOOT)
    assert [(x.code, x.bus) for x in journal] == [(13, "0000:5d:00"), (13, "0000:5d:00"), (79, "0000:3a:00")]
    assert journal[2].age_s == pytest.approx(12 * 3600 - 11 * 3600 - 47 * 60 - 2)
    assert journal[2].text == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    dmesg = gh.parse_xids(sample("dmesg-xid.txt").splitlines(), NOW, BOOT)
    assert [x.code for x in dmesg] == [48, 63, 94]
    assert dmesg[0].age_s == pytest.approx(NOW - BOOT - 95312.907763)
    iso = gh.parse_xids(sample("dmesg-iso-xid.txt").splitlines(), NOW, BOOT)
    assert [(x.code, round(x.age_s or 0)) for x in iso] == [(74, round(NOW - datetime.fromisoformat(
        "2025-11-01T22:10:03.518235+00:00").timestamp())), (31, 7200)]


def test_a_healthy_node_passes_with_its_count_and_driver():
    h = gh.judge(reading(kernel="dmesg-iso-xid.txt"), setup_gpus=8)  # only old or program Xids there
    assert h.problems == [] and h.drain_reason() == ""
    item = h.item()
    assert item.ok and item.detail == "8 GPU(s), driver 550.90.07, no uncorrected ECC error, no Xid"


def test_an_xid_79_drains_the_node_and_a_programs_xid_13_does_not():
    h = gh.judge(reading(kernel="journal-xid.txt"), setup_gpus=8)
    assert [(p.what, p.drains) for p in h.problems] == [
        ("Xid 79 on GPU 0000:3a:00 (GPU has fallen off the bus)", True)]
    item = h.item()
    assert not item.ok and item.detail == "DRAINED: Xid 79 on GPU 0000:3a:00 (GPU has fallen off the bus)"
    assert item.fix == ("reboot the node; if it comes back, reseat the GPU or check its power; then 'distrun check' "
                        "again (a check that passes brings the node back)")


def test_xids_older_than_the_window_are_left_out():
    later = NOW + gh.XID_WINDOW_S + 60
    assert gh.judge(reading(kernel="journal-xid.txt", now=later), setup_gpus=8).problems == []


def test_a_double_bit_error_and_a_pending_remap_drain_a_contained_error_does_not():
    h = gh.judge(reading(kernel="dmesg-xid.txt", remap="remapped-rows-pending.csv"), setup_gpus=8)
    assert [(p.what, p.drains) for p in h.problems] == [
        ("GPU 00000000:2A:00.0: a row remapping waits for a reset", True),
        ("Xid 48 on GPU 0000:2a:00 (double-bit ECC error)", True),
        ("Xid 63 on GPU 0000:2a:00 (ECC page retirement or row remapping recorded)", True)]
    assert "Xid 94" not in h.drain_reason()
    assert h.item().fix.startswith("reset the GPU (nvidia-smi -r with nothing running on it) or reboot the node")


def test_a_failed_row_remapping_asks_for_a_new_gpu():
    h = gh.judge(reading(remap="remapped-rows-failed.csv"), setup_gpus=8)
    assert [(p.what, p.fix, p.drains) for p in h.problems] == [
        ("GPU 00000000:2A:00.0: a row remapping failed", "have the GPU replaced", True)]


def test_uncorrected_ecc_errors_drain_persistence_off_only_fails():
    h = gh.judge(reading("query-gpu-ecc-and-persistence.csv", devices=4), setup_gpus=4)
    assert [(p.what, p.drains) for p in h.problems] == [
        ("GPU 0: persistence mode off", False), ("GPU 1: persistence mode off", False),
        ("GPU 2: persistence mode off", False),
        ("GPU 3 (00000000:4E:00.0): 2 uncorrected ECC error(s) since the driver loaded", True),
        ("GPU 3: persistence mode off", False)]
    assert h.drain_reason() == "GPU 3 (00000000:4E:00.0): 2 uncorrected ECC error(s) since the driver loaded"
    only_pm = gh.judge(reading("query-gpu-ecc-and-persistence.csv", devices=4).copy() | {
        "query": {"rc": 0, "out": sample("query-gpu-ecc-and-persistence.csv").replace(", 2, 2", ", 0, 2"), "err": ""}},
        setup_gpus=4)
    assert only_pm.drain_reason() == "" and not only_pm.item().ok
    assert only_pm.item().fix == "turn it on: 'nvidia-smi -pm 1', or enable nvidia-persistenced (role nvidia does)"


def test_a_lost_gpu_and_a_missing_one_drain():
    lost = gh.judge(reading("query-gpu-one-lost.txt", rc=15, devices=4), setup_gpus=4)
    assert [p.what for p in lost.problems] == ["GPU 0000:3A:00.0 does not answer (Unknown Error)"]
    assert lost.drain_reason()
    missing = gh.judge(reading("query-gpu-ecc-and-persistence.csv".replace("ecc-and-persistence", "8-healthy"),
                               devices=7), setup_gpus=9)
    assert missing.problems[0].what == "8 of 9 GPU(s) answer nvidia-smi" and missing.problems[0].drains


@pytest.mark.parametrize("sample_file,rc,fix_starts", [
    ("smi-no-driver.txt", 9, "load the driver (modprobe nvidia)"),
    ("smi-version-mismatch.txt", 18, "reboot the node: the loaded kernel module is older"),
])
def test_nvidia_smi_failing_drains_with_the_fix_for_its_message(sample_file, rc, fix_starts):
    h = gh.judge(reading(sample_file, rc=rc), setup_gpus=8)
    assert len(h.problems) == 1 and h.problems[0].drains
    assert h.problems[0].what.startswith("nvidia-smi fails: " + sample(sample_file).split("\n")[0][:40])
    assert h.problems[0].fix.startswith(fix_starts)


def test_gpus_without_nvidia_smi_drain_a_node_without_either_has_no_gpus():
    h = gh.judge({"devices": 4, "smi": "", "now": NOW, "boot": BOOT}, setup_gpus=0)
    assert h.has_gpus and h.problems[0].what == "4 GPU(s) but no nvidia-smi" and h.problems[0].drains
    none = gh.judge({"devices": 0, "smi": "", "now": NOW, "boot": BOOT}, setup_gpus=0)
    assert not none.has_gpus and none.problems == [] and none.drain_reason() == ""
    tools_only = gh.judge(reading("smi-no-devices.txt", rc=6, devices=0), setup_gpus=0)
    assert not tools_only.has_gpus and tools_only.problems == []


def test_a_driver_other_than_most_nodes_fails_without_draining():
    other = reading()
    other["query"] = {"rc": 0, "out": sample("query-gpu-8-healthy.csv").replace("550.90.07", "535.183.01"), "err": ""}
    health = gh.judge_all({"n1": reading(), "n2": reading(), "n3": other}, {"n1": 8, "n2": 8, "n3": 8})
    assert health["n1"].problems == [] and health["n2"].problems == []
    assert [(p.what, p.drains) for p in health["n3"].problems] == [
        ("driver 535.183.01, while most nodes have 550.90.07", False)]


def test_an_unknown_xid_fails_and_names_the_catalog_without_draining():
    r = reading()
    r["kernel"]["lines"] = ["2025-11-03T11:00:00+00:00 n kernel: NVRM: Xid (PCI:0000:18:00): 999, pid=1, something new"]
    h = gh.judge(r, setup_gpus=8)
    assert [(p.what, p.drains) for p in h.problems] == [("Xid 999 on GPU 0000:18:00 (Xid 999, not in distrun's list)", False)]
    assert "NVIDIA's Xid catalog" in h.problems[0].fix


# -- the node program


def fake_tools(bin_dir: Path, query: str, query_rc: int = 0, journal: str = "") -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "q.txt").write_text(query)
    (bin_dir / "j.txt").write_text(journal)
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        f"  --query-gpu=*) cat {bin_dir}/q.txt; exit {query_rc};;\n"
        f"  --query-remapped-rows=*) printf 'gpu_bus_id, remapped_rows.uncorrectable, remapped_rows.pending, "
        "remapped_rows.failure\\n'; exit 0;;\nesac\nexit 2\n")
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {bin_dir}/j.txt\n")
    for tool in ("nvidia-smi", "journalctl"):
        (bin_dir / tool).chmod(0o755)


def run_program(path: str) -> dict:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM.read_text()], capture_output=True, text=True,
                          env={"PATH": path}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_node_program_reads_nvidia_smi_and_the_xid_lines_only(tmp_path):
    fake_tools(tmp_path / "bin", sample("query-gpu-8-healthy.csv"), journal=sample("journal-xid.txt"))
    got = run_program(f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert got["smi"] == str(tmp_path / "bin" / "nvidia-smi")
    assert got["query"] == {"rc": 0, "out": sample("query-gpu-8-healthy.csv"), "err": ""}
    assert got["kernel"]["source"] == "journalctl -k -b -o short-iso --no-pager -q"
    assert got["kernel"]["lines"] == [ln for ln in sample("journal-xid.txt").splitlines() if "NVRM: Xid (" in ln]
    assert abs(got["now"] - __import__("time").time()) < 30 and got["boot"] > 0
    # What it read judges like the samples: Xid 79 drains (its time is in the past: within 24 h
    # of the node's clock only if the sample were recent, so the window is the node's own).
    h = gh.judge(got | {"now": NOW}, setup_gpus=8)
    assert h.drain_reason() == "Xid 79 on GPU 0000:3a:00 (GPU has fallen off the bus)"


def test_the_node_program_on_a_node_without_gpus_reads_nothing_more(tmp_path):
    if any(Path("/dev").glob("nvidia[0-9]*")):
        pytest.fail("this test needs a machine without NVIDIA devices (it checks the no-GPU path)")
    got = run_program("/usr/bin:/bin")
    assert set(got) == {"devices", "smi", "now", "boot"} and got["devices"] == 0 and got["smi"] == ""
    assert not gh.judge(got, setup_gpus=0).has_gpus


def test_the_node_program_reports_a_failing_nvidia_smi(tmp_path):
    fake_tools(tmp_path / "bin", sample("smi-version-mismatch.txt"), query_rc=18)
    got = run_program(f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert got["query"]["rc"] == 18
    h = gh.judge(got, setup_gpus=2)
    assert h.problems[0].what == "nvidia-smi fails: Failed to initialize NVML: Driver/library version mismatch NVML " \
                                 "library version: 550.127"


def test_the_task_runs_the_program_and_publishes_its_fact():
    from distrun.preflight.check import HEALTH_FACT
    from distrun.transport import nodeprog

    text = (REPO / "roles" / "preflight" / "tasks" / "gpu_health.yml").read_text()
    assert "program: gpuhealth" in text and f"{HEALTH_FACT}:" in text
    assert nodeprog.files("gpuhealth") == [PROGRAM]  # the one recipe sends the program alone
    main = (REPO / "roles" / "preflight" / "tasks" / "main.yml").read_text()
    assert "file: gpu_health.yml" in main and "when: preflight_full | bool" in main.split("file: gpu_health.yml")[1][:200]
    assert os.access(PROGRAM, os.R_OK)


# ------------------------------------------------------------------ declared (gpus: N) against detected

def test_more_gpus_than_the_inventory_declares_fail_the_check_naming_both_counts_and_the_fix():
    """nvidia-smi as it prints 8 GPUs on a node the inventory says has 4: one line, no drain."""
    h = gh.judge(reading("query-gpu-8-healthy.csv"), setup_gpus=4, declared=4, host="node7")
    assert [(p.what, p.fix, p.drains) for p in h.problems] == [(
        "nvidia-smi detects 8 GPU(s), gpus: 4 declared in the inventory",
        "set gpus: 8 for node7 in the inventory (runs place ranks only on the GPUs it declares)", False)]
    assert not h.item().ok and h.drain_reason() == ""
    assert gh.judge(reading("query-gpu-8-healthy.csv"), setup_gpus=8, declared=8, host="node7").problems == []


def test_fewer_gpus_than_declared_drain_and_say_the_declared_count_and_both_fixes():
    h = gh.judge(reading("query-gpu-workstation-na.csv", devices=2), setup_gpus=4, declared=4, host="node7")
    assert [p.what for p in h.problems] == ["2 of 4 GPU(s) answer nvidia-smi (gpus: 4 declared)"] and h.drain_reason()
    assert h.problems[0].fix.endswith("(or set gpus: 2 for node7 in the inventory if it has no more)")


def test_declared_gpus_on_a_node_with_no_nvidia_smi_and_no_device_say_so_without_draining():
    """The CPU test nodes with gpus: 4 declared: the check fails with the two fixes, the node stays in."""
    h = gh.judge({"devices": 0, "smi": "", "now": NOW, "boot": BOOT}, setup_gpus=4, declared=4, host="node1")
    assert [(p.what, p.drains) for p in h.problems] == [
        ("gpus: 4 declared in the inventory, none detected (no nvidia-smi, no /dev/nvidia*)", False)]
    assert h.problems[0].fix == ("install the NVIDIA driver ('distrun setup' with nvidia_driver_enabled: true), or set "
                                 "gpus: 0 for node1 in the inventory if it has no GPU")
    assert h.drain_reason() == "" and not h.item().ok
    # Devices without nvidia-smi: the driver's tools are missing on a GPU node, which drains as before.
    assert gh.judge({"devices": 4, "smi": "", "now": NOW, "boot": BOOT}, setup_gpus=4, declared=4).drain_reason()


def test_judge_all_compares_each_node_with_its_own_declared_count():
    got = gh.judge_all({"a": reading(), "b": reading()}, {"a": 8, "b": 4}, {"b": 4})
    assert got["a"].problems == [] and [p.what for p in got["b"].problems] == [
        "nvidia-smi detects 8 GPU(s), gpus: 4 declared in the inventory"]
    assert "set gpus: 8 for b " in got["b"].problems[0].fix
