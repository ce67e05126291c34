"""The failed-task reader used to explain molecule and ansible-playbook failures in test output."""

from __future__ import annotations

from tests.harness.ansible_log import failed_tasks

LOG = """\
PLAY [Verify] ******
TASK [Wait for systemd to finish booting on node2] ******
ok: [node1]
\x1b[0;31mfatal: [node2]: FAILED! => {"changed": false, "stdout": "starting"}\x1b[0m
TASK [Optional probe] ******
fatal: [node3]: FAILED! => {"msg": "whatever"}
...ignoring
TASK [Check the sum] ******
  │ failed: [node1] (item=3) => {"msg": "sum 5, want 6"}
PLAY RECAP ******
"""


def test_names_each_failed_task_with_its_host_and_message():
    out = failed_tasks(LOG)
    assert "task [Wait for systemd to finish booting on node2] fatal on node2" in out
    assert '"stdout": "starting"' in out
    assert "task [Check the sum] failed on node1" in out and "sum 5, want 6" in out


def test_ignored_failures_and_clean_logs_give_nothing():
    assert "Optional probe" not in failed_tasks(LOG)
    assert failed_tasks("TASK [a] ***\nok: [node1]\n") == ""
