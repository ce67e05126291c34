"""Every rank inside a container image (``distrun_image``) on the 3-node cluster, with rootless
podman as `distrun setup` installs it on the nodes (role base: podman, uidmap, the training
user's subordinate ids).

The image is made the way a site without a registry makes one: from what the training user can
read of a node's own files (its /usr, /etc, and the training venv, which the image puts first on
PATH), imported by that user on node1 and handed to node2 and node3 by `distrun push-image
--from node1` (the nodes then hold the same image id). The cells run the matrix's torch program (an allreduce, a DDP with a
DistributedSampler) under mpirun (one container per rank, the host's mpirun outside), torchrun
and Slurm's multi-job mode (one container per node, torchrun inside); every rank reports that it
ran in a container and in its node's own network namespace.
"""

from __future__ import annotations

import json
import re
import signal
import stat
import textwrap
import time

import pytest

from distrun.planning import containers
from tests.harness import matrix

from .conftest import REPO, distrun, outside_runs, run_processes, start_distrun
from .hostile import TALLY
from .test_matrix import HOSTS

IMAGE = "localhost/distrun-cell:1"
USER = "distrun"
PATH = "/opt/distrun/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the image leaves out of the node's files: secrets (/etc's shadow files, sudoers, ssh host
# keys), what is the node's own (its name and hosts file), and what no rank reads (docs, headers,
# the compiler).
EXCLUDES = ("./etc/shadow*", "./etc/gshadow*", "./etc/sudoers*", "./etc/ssh", "./etc/hostname", "./etc/hosts",
            "./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./usr/share/info", "./usr/include",
            "./usr/lib/gcc", "./usr/libexec/gcc", "./opt/distrun/venv/lib/python3.11/site-packages/jittor*")
CONTAINERS = ("mpirun", "torchrun", "slurm multi-job")
STORAGE_CONF = '[storage]\ndriver = "overlay"\n[storage.options.overlay]\nmount_program = "/usr/bin/fuse-overlayfs"\n'


def as_user(cluster, k: int, cmd: str, timeout: float = 600, input: str | None = None):
    """``cmd`` as the training user on node k, in its home (rootless podman keeps its images there),
    as distrun runs that user's podman outside a run: in a unit of the user's own, which ends with
    it (its pause process too), so the tests leave no process of the user's behind either."""
    argv = containers.in_user_unit(USER, ["sh", "-c", f"cd && {cmd}"], int(timeout))
    return cluster.exec(k, argv, check=False, timeout=timeout, input=input)


def image_id(cluster, k: int, ref: str = IMAGE) -> str:
    out = as_user(cluster, k, f"podman image inspect --format '{{{{.Id}}}}' {ref}", timeout=120)
    return out.stdout.strip() if out.returncode == 0 else ""


def run_containers(cluster, run_id: str) -> dict[int, list[str]]:
    """Node -> the ids of the run's containers (running or not) in the training user's store."""
    found = {}
    for k in (1, 2, 3):
        out = as_user(cluster, k, f"podman ps -aq --filter label=distrun.run={run_id}", timeout=120)
        assert out.returncode == 0, out.stderr
        found[k] = out.stdout.split()
    return found


@pytest.fixture(scope="module")
def image_inventory(provisioned, distrun_home, tmp_path_factory) -> str:
    """The test inventory with ``distrun_image``, once the image is in the training user's store
    on every node with one id: made on node1, then `distrun push-image --from node1`."""
    cluster = provisioned
    group_vars = REPO / "inventory" / "test" / "group_vars"
    inv = str(matrix.mode_inventory(provisioned.inventory, group_vars, tmp_path_factory.mktemp("image"), None,
                                    distrun_image=IMAGE))
    t0 = time.monotonic()
    for k in (1, 2, 3):
        # A machine's /dev/fuse is everyone's (udev); the nodes have the host's, root's only. With
        # it, rootless podman stores images on fuse-overlayfs, as on a machine's overlay: a
        # container starts without copying its image (the vfs driver it picks otherwise does).
        assert cluster.exec(k, "chmod 0666 /dev/fuse", check=False).returncode == 0
        conf = as_user(cluster, k, "mkdir -p .config/containers && cat > .config/containers/storage.conf",
                       input=STORAGE_CONF)
        assert conf.returncode == 0, conf.stderr
    if not image_id(cluster, 1):
        excludes = " ".join(f"--exclude={e}" for e in EXCLUDES)
        # Read as the training user: the image holds only what a rank could read on the node anyway
        # (the munge key, ssh host keys, shadow are unreadable to it and left out).
        made = as_user(cluster, 1, f"tar -C / --ignore-failed-read --warning=no-failed-read {excludes} "
                                   "-cf cell-rootfs.tar ./usr ./etc ./opt/distrun/venv ./bin ./lib ./lib64 ./sbin")
        assert made.returncode == 0, made.stderr[-2000:]
        imported = as_user(cluster, 1, f"podman import --change 'ENV PATH={PATH}' cell-rootfs.tar {IMAGE}")
        as_user(cluster, 1, "rm -f cell-rootfs.tar")
        assert imported.returncode == 0, imported.stderr[-2000:]
    matrix.record_step(f"cluster A: image {IMAGE} made on node1", time.monotonic() - t0)
    want = image_id(cluster, 1)
    t0 = time.monotonic()
    first = distrun("push-image", IMAGE, "--inventory", inv, "--from", "node1", timeout=1200)
    assert first.rc == 0, first.stdout[-3000:] + first.stderr[-2000:]
    lines = first.stdout.splitlines()
    assert lines[0] == f"node1: has {want[:12]}, nothing moved", first.stdout
    for line, host in zip(lines[1:3], ("node2", "node3"), strict=True):
        assert re.fullmatch(rf"{host}: loaded {want[:12]} \(\d+\.\d\d GiB in \d+\.\d s\)", line), first.stdout
    assert [image_id(cluster, k) for k in (1, 2, 3)] == [want] * 3
    took_first = time.monotonic() - t0
    matrix.record_step(f"cluster A: push-image to node2, node3: {'; '.join(lines[1:3])}; {lines[-1]}", took_first)
    # A second push of the same image moves nothing: every node has its id.
    t0 = time.monotonic()
    second = distrun("push-image", IMAGE, "--inventory", inv, "--from", "node1", timeout=600)
    assert second.rc == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert second.stdout.splitlines() == [f"node{k}: has {want[:12]}, nothing moved" for k in (1, 2, 3)] + [
        f"{IMAGE} {want[:12]}: 0.0 MiB moved to 0 of 3 node(s); no archive needed"], second.stdout
    took_second = time.monotonic() - t0
    # The archive the first push saved: the submitter's alone. It is 1.5 GB of test data: removed.
    archive = next((distrun_home / "images").glob(f"{want}.tar"))
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600 and stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    archive.unlink()
    matrix.record_step("cluster A: push-image again: 0 bytes moved", took_second)
    print(f"\npush-image, first: {lines[-1]} ({took_first:.1f} s); second: nothing moved ({took_second:.1f} s)")
    return inv


def test_setup_gave_the_training_user_what_rootless_podman_needs(provisioned):
    for k in (1, 2, 3):
        # No lingering: each run's unit has its own runtime folder (no user manager between runs).
        out = provisioned.exec(k, f"grep -c '^{USER}:' /etc/subuid /etc/subgid; test ! -e /var/lib/systemd/linger/{USER}"
                                  " && echo no-linger; podman --version", check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:3] == ["/etc/subuid:1", "/etc/subgid:1", "no-linger"], out.stdout


def _where(run) -> dict[int, tuple[str, str]]:
    """Rank -> (in a container, network namespace), from the collected rank logs."""
    seen = {}
    for f in (run / "nodes").rglob("*"):
        if f.is_file() and f.name in ("stdout", "stdout.log"):
            for m in matrix.WHERE_LINE.finditer(f.read_text(errors="replace")):
                seen[int(m[1])] = (m[2], m[3])
    return seen


@pytest.mark.parametrize("launcher", CONTAINERS)
def test_every_rank_runs_in_the_image_on_its_node_s_network(provisioned, image_inventory, distrun_home, cell_script,
                                                            launcher):
    cluster = provisioned
    cell = matrix.run_cell(distrun, image_inventory, launcher, "sync", "yaml-image", distrun_home, cell_script, HOSTS)
    run = distrun_home / "runs" / cell.run_id
    host_netns = [cluster.exec(k, "readlink /proc/1/ns/net").stdout.strip() for k in (1, 2, 3)]
    where = _where(run)
    assert sorted(where) == [0, 1, 2], where
    assert [where[r] for r in (0, 1, 2)] == [("True", ns) for ns in host_netns], (where, host_netns)
    shown = distrun("show", cell.run_id, "--json", timeout=120)
    assert shown.rc == 0, shown.stderr
    image = json.loads(shown.stdout)["image"]
    want = image_id(cluster, 1)
    assert image["ref"] == IMAGE and image["same"] is True, image
    assert {h: i.removeprefix("sha256:") for h, i in image["nodes"].items()} == dict.fromkeys(HOSTS, want), image
    assert run_containers(cluster, cell.run_id) == {1: [], 2: [], 3: []}  # --rm: none left after the run
    # Rootless podman's pause process started in the run's units and ended with them; no manager of
    # the user's runs between runs: nothing of the training user's is left on any node.
    assert outside_runs(cluster) == {1: [], 2: [], 3: []}
    if launcher.startswith("slurm"):
        # A Slurm job's podman starts its pause process in slurmd's cgroup (proctrack/linuxproc),
        # outside the job's process tree: slurmd's epilog ended it on every node, and took the
        # runtime folder away where no process of the user's was left (node1 may have the
        # harness's Jittor build, a login of the user's, which keeps it there).
        for k in (1, 2, 3):
            left = cluster.exec(k, f"for p in $(pgrep -u {USER}); do grep -qs slurmd.service /proc/$p/cgroup && "
                                   f"echo $p $(cat /proc/$p/comm); done; true", check=False)
            assert left.stdout.strip() == "", f"node{k}: {left.stdout}"
        # (a unit of distrun's since, run_containers' look among them, left its empty mount point there: root's)
        for k in (2, 3):
            folder = cluster.exec(k, f"find /run/user -mindepth 1 -maxdepth 1 -user {USER}", check=False)
            assert folder.returncode == 0 and folder.stdout.strip() == "", f"node{k}: {folder.stdout}{folder.stderr}"


def test_a_node_with_another_image_under_the_name_is_refused_and_nothing_starts(provisioned, image_inventory,
                                                                               distrun_home, cell_script):
    cluster = provisioned
    odd = "localhost/distrun-odd:1"
    for k in (1, 2):
        assert as_user(cluster, k, f"podman tag {IMAGE} {odd}").returncode == 0
    # node3's image of that name is another one (a one-file image).
    made = as_user(cluster, 3, f"mkdir -p odd && echo odd > odd/x && tar -C odd -c . | podman import - {odd}")
    assert made.returncode == 0, made.stderr
    try:
        before = set((distrun_home / "runs").glob("*-train-*"))
        res = distrun("train", "--inventory", image_inventory, "--image", odd, "--launcher", "torchrun",
                      "--script", str(cell_script), timeout=600)
        out = res.stdout + res.stderr
        assert res.rc != 0, out[-3000:]
        line = re.search(rf"image {re.escape(odd)} on node3 is sha256:[0-9a-f]{{12}} but sha256:[0-9a-f]{{12}} on "
                         r"node1,node2", out)
        assert line, out[-3000:]
        assert f"give node3 the same image: 'distrun push-image {odd} --from node1'" in out, out[-3000:]
        # Nothing started: no rank log, no container of the new run on any node.
        new = set((distrun_home / "runs").glob("*-train-*")) - before
        for run in new:
            assert not list((run / "nodes").rglob("stdout*")), run
            assert run_containers(cluster, run.name) == {1: [], 2: [], 3: []}
    finally:
        for k in (1, 2, 3):
            as_user(cluster, k, f"podman rmi {odd}")
    # A name no node has: every node named, with the fix.
    res = distrun("train", "--inventory", image_inventory, "--image", "localhost/distrun-none:1", "--launcher",
                  "mpirun", "--script", str(cell_script), timeout=600)
    out = res.stdout + res.stderr
    # (the stores hold localhost/distrun-cell:1, close enough to be offered)
    assert res.rc != 0 and re.search(r"image localhost/distrun-none:1 is not in podman's images of distrun"
                                     r"(; did you mean [^?\s]+\?)? on node1, node2, node3", out), out[-3000:]


# A job builds an image of its own on every node (the pushed image with one file added, so it
# still runs every rank; a fixed timestamp makes it the same id everywhere) and tags it with the
# name later runs use: the nodes then agree with each other, not with what 'distrun push-image'
# put there.
RETAG_JOB = textwrap.dedent(r"""
    import os, shutil, socket, subprocess, sys, tempfile
    image = sys.argv[1]
    ctx = tempfile.mkdtemp(dir=os.getcwd())
    with open(os.path.join(ctx, "marker"), "w") as f:
        f.write("made by a job\n")
    with open(os.path.join(ctx, "Containerfile"), "w") as f:
        f.write(f"FROM {image}\nCOPY marker /job-made\n")
    done = subprocess.run(["podman", "--cgroup-manager=cgroupfs", "build", "-q", "--timestamp", "0", "-t", image, ctx],
                          capture_output=True, text=True, timeout=600)
    shutil.rmtree(ctx)
    sys.stdout.write(f"RETAGGED {socket.gethostname()} rc={done.returncode} {done.stderr[-300:]!r}\n")
""")

IN_IMAGE = textwrap.dedent(r"""
    import os, socket, sys
    sys.stdout.write(f"JOBMADE {socket.gethostname()} {os.path.exists('/job-made')}\n")
""")


def test_an_image_a_job_tagged_with_a_pushed_name_is_refused_on_every_node(provisioned, image_inventory, distrun_home,
                                                                          tmp_path):
    cluster = provisioned
    pushed = image_id(cluster, 1)
    job, probe = tmp_path / "retag.py", tmp_path / "in_image.py"
    job.write_text(RETAG_JOB)
    probe.write_text(IN_IMAGE)
    try:
        res = distrun("train", "--inventory", "test", "--launcher", "mpirun", "--script", str(job), "--", IMAGE,
                      timeout=900)
        assert res.rc == 0 and res.stdout.count("RETAGGED ") == 3 and "rc=0" in res.stdout, res.stdout[-3000:]
        made = [image_id(cluster, k) for k in (1, 2, 3)]
        assert len(set(made)) == 1 and made[0] != pushed, (made, pushed)  # the nodes agree: on the job's image

        later = distrun("train", "--inventory", image_inventory, "--launcher", "torchrun", "--script", str(probe),
                        timeout=600)
        out = later.stdout + later.stderr
        ran_in_jobs = "JOBMADE" in out and " True" in out
        assert not TALLY.record("an image a job tagged with a pushed name on every node runs a later run's ranks",
                                later.rc == 0 or ran_in_jobs), out[-3000:]
        assert re.search(rf"image {re.escape(IMAGE)} on node1 is sha256:[0-9a-f]{{12}}, not the sha256:{pushed[:12]} "
                         r"'distrun push-image' put there", out), out[-3000:]
        assert f"push it again from where it was built: 'distrun push-image {IMAGE}'" in out, out[-3000:]
    finally:
        for k in (1, 2, 3):  # the pushed image under its name again, the job's gone
            jobs = image_id(cluster, k)
            as_user(cluster, k, f"podman tag {pushed} {IMAGE}")
            if jobs and jobs != pushed:
                as_user(cluster, k, f"podman rmi -f {jobs}")
    assert [image_id(cluster, k) for k in (1, 2, 3)] == [pushed] * 3


SLEEPER = textwrap.dedent("""
    import os, time
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    open(f"up-{rank}", "w").close()
    time.sleep(900)
""")


# mpirun: a container per rank, started through the relay on the nodes but the head; torchrun's
# one container per node is removed by the same label.
@pytest.mark.parametrize("launcher", ["mpirun"])
def test_ctrl_c_leaves_no_container_and_no_rank_on_any_node(provisioned, image_inventory, distrun_home, tmp_path,
                                                            launcher):
    cluster = provisioned
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    before = set((distrun_home / "runs").glob("*-train-*"))
    with open(tmp_path / "train.log", "w") as log:
        proc = start_distrun("train", "--inventory", image_inventory, "--launcher", launcher, "--script", str(script),
                             log=log)
        try:
            deadline = time.monotonic() + 300
            up: dict[int, str] = {}
            while time.monotonic() < deadline and len(up) < 3 and proc.poll() is None:
                time.sleep(2)
                for k in (1, 2, 3):
                    out = cluster.exec(k, "ls /srv/distrun/runs/*/up-* 2>/dev/null", check=False)
                    if out.stdout.strip():
                        up[k] = out.stdout.strip()
            assert len(up) == 3, f"ranks up on {sorted(up)}; train: {(tmp_path / 'train.log').read_text()[-3000:]}"
            run_id = (set((distrun_home / "runs").glob("*-train-*")) - before).pop().name
            running = run_containers(cluster, run_id)
            assert all(len(ids) == 1 for ids in running.values()), running
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                distrun("stop", "last", timeout=300)
    text = (tmp_path / "train.log").read_text()
    assert rc != 0, text[-3000:]
    assert run_containers(cluster, run_id) == {1: [], 2: [], 3: []}, text[-3000:]
    # Any process of the run: its tag (mpirun, the orteds, the relays, the ranks, in their
    # containers too), or the program's name (the bracket keeps this check's own shell out).
    assert run_processes(cluster, run_id) == []
    pattern = f"[{script.name[0]}]{script.name[1:]}"
    for k in (1, 2, 3):
        left = cluster.exec(k, f"ps -eo pid,args | grep -e '{pattern}' || true", check=False)
        assert left.stdout.strip() == "", f"node{k} still runs:\n{left.stdout}"


def test_a_shared_folder_mounted_again_after_podman_ran_is_the_one_the_next_run_sees(
        provisioned, image_inventory, distrun_home, cell_script):
    """Rootless podman's pause process keeps the mounts it saw when it started. It starts in each
    run's unit (its own runtime folder) and ends with it, so the shared folder mounted again since
    podman last ran (here a copy bound over it on node2, as a remount or a mode switch leaves it)
    is the folder the next run's containers see: the run passes, with no 'podman system migrate'."""
    cluster = provisioned
    shared = "/srv/distrun"
    up = as_user(cluster, 2, f"podman run --rm --network=host --entrypoint true {IMAGE}", timeout=300)
    assert up.returncode == 0, up.stderr
    cluster.exec(2, f"rm -rf {shared}-again && mkdir {shared}-again && tar -C {shared} --exclude=./runs --exclude=./partitions "
                    f"-cf - . | tar -C {shared}-again -xf - && mkdir -p {shared}-again/runs && "
                    f"chown -R {USER}: {shared}-again && mount --bind {shared}-again {shared}")
    try:
        ran = distrun("train", "--inventory", image_inventory, "--launcher", "torchrun", "--script", str(cell_script),
                      timeout=900)
        assert ran.rc == 0, (ran.stdout + ran.stderr)[-3000:]
    finally:
        cluster.exec(2, f"umount {shared}; rm -rf {shared}-again", check=False)


def test_a_name_no_node_has_is_one_short_line_with_the_names_close_to_it(provisioned, image_inventory, cell_script):
    res = distrun("train", "--inventory", image_inventory, "--image", "localhost/distrun-cel:1", "--launcher", "torchrun",
                  "--script", str(cell_script), timeout=600)
    out = res.stdout + res.stderr
    assert res.rc == 3, out[-3000:]
    line = next(ln for ln in out.splitlines() if "localhost/distrun-cel:1 is not in" in ln)
    assert f"did you mean {IMAGE}? on node1, node2, node3" in line and len(line) < 600, line


def test_check_reports_the_images_python_torch_and_storage(provisioned, image_inventory):
    res = distrun("check", "--inventory", image_inventory, "--json", timeout=600)
    report = json.loads(res.stdout)
    details = {h: it["detail"] for h, it in report["checks"]["image"].items()}
    assert all(it["ok"] for it in report["checks"]["image"].values()), details
    assert all(re.search(r"python 3\.\d+\.\d+, torch \d+\.\d+.*, storage (overlay|vfs)", d) for d in details.values()), details
