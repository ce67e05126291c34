"""A run whose run directory a launch host can no longer read: the follower is root's (it holds
what it follows open, with the training user's rights), so the ranks' own result stands; what can
no longer be done there is said with the host, the path and the cause, never "lost contact"."""

from __future__ import annotations

import textwrap

from .conftest import distrun, run_processes
from .test_train import _latest_run

# torchrun starts a launcher on every node; the one on node3 loses its run directory (its own job
# takes every permission away, as a dropped mount would) while the ranks still run.
SCRIPT = textwrap.dedent("""
    import os, socket, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    if socket.gethostname() == "node3":
        os.chmod(os.getcwd(), 0)
    time.sleep(5)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_a_launch_host_whose_run_directory_is_unreadable_is_named_with_that_cause(provisioned, distrun_home, tmp_path):
    script = tmp_path / "unreadable.py"
    script.write_text(SCRIPT)
    result = distrun("train", "--inventory", "test", "--launcher", "torchrun", "--script", str(script), timeout=600)
    run = _latest_run(distrun_home)
    try:
        said = " ".join((result.stdout + result.stderr).split())
        assert result.rc == 0 and f"run {run.name} succeeded" in said, said[-3000:]  # every rank did
        run_dir = f"/srv/distrun/runs/{run.name}"
        assert f"collect from node3 refused: the run directory {run_dir} is not readable as its user" in said, said[-3000:]
        assert f"could not be removed on node3: remove {run_dir}/env.sh there" in said, said[-3000:]
        assert "per-rank logs: 2 of 3 collected" in said, said[-3000:]
        assert "lost contact" not in said, said[-3000:]
        assert not run_processes(provisioned, run.name)
    finally:
        provisioned.exec(3, f"chmod 0750 /srv/distrun/runs/{run.name}", check=False)
