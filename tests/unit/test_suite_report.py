"""The suite's closing report: how busy the CPUs were while the two pytest streams overlapped."""

from __future__ import annotations

import pytest

from tests.harness.suite_report import cpu_busy, cpu_lines, read_cpu_log


def test_cpu_busy_reads_proc_stat_samples_between_two_times(tmp_path):
    log = tmp_path / "cpu.log"
    # user nice system idle iowait irq softirq steal: 100 jiffies per 10 s on one core (say).
    log.write_text("100 cpu 0 0 0 0 0 0 0 0\n"
                   "110 cpu 90 0 0 10 0 0 0 0\n"  # 90% busy
                   "120 cpu 120 0 10 50 20 0 0 0\n"  # 40 busy, 40 idle, 20 iowait: 40%
                   "garbage line\n"
                   "130 cpu 170 0 10 100 20 0 0 0\n")  # 50% busy
    samples = read_cpu_log(log)
    assert [t for t, _ in samples] == [100, 110, 120, 130]
    assert cpu_busy(samples, 100, 110) == 0.9
    assert cpu_busy(samples, 110, 120) == 0.4
    assert cpu_busy(samples, 100, 130) == pytest.approx(180 / 300)
    assert cpu_busy(samples, 125, 130) is None  # one sample only
    rows = [{"layer": "unit", "stop": 110.0}, {"layer": "cluster", "stop": 130.0}]
    assert cpu_lines(samples, rows) == []  # windows under 30 s are not reported
    long = [(100.0 + 10 * i, [90 * i, 0, 0, 10 * i if i < 6 else 10 * 6 + 50 * (i - 6), 0]) for i in range(12)]
    rows = [{"layer": "molecule", "stop": 150.0}, {"layer": "cluster", "stop": 210.0}]
    # from 150 s to 210 s: 540 jiffies busy, 260 idle
    assert cpu_lines(long, rows) == ["CPU busy: 90% over 50 s with both streams; 68% over 60 s with the cluster alone"]
