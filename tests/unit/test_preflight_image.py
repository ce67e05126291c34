"""The container image in the preflight: every node must have the run's image, the same one."""

from __future__ import annotations

import getpass
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distrun.planning.containers import Container
from distrun.planning.needs import preflight_needs

from .plans import plan_for
from .probe_text import probe_text
from .test_check import NODES
from .test_preflight_needs import SETUP, cluster, failed, judge, probe, verdict

REF = "localhost/train:1"
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def image(found: str = A, **over) -> dict:
    return {"ref": REF, "runtime": "podman", "user": "distrun", "id": found, **over}


def test_the_same_image_on_every_node_passes_and_says_its_id():
    probes = {h: probe(h, image=image()) for h in NODES}
    assert judge(probes, failed()) == ""


def test_a_node_without_the_image_is_named_with_the_pull_as_the_training_user():
    probes = {h: probe(h, image=image()) for h in NODES}
    probes["node2"]["image"] = image("", error="localhost/train:1: image not known")
    line = judge(probes, failed("node2"))
    assert line == ("image: image localhost/train:1 is not in podman's images of distrun on node2: give it the image: "
                    "'distrun push-image localhost/train:1 --from node1', or 'podman pull localhost/train:1' there as distrun")


def test_no_node_with_the_image_points_at_a_push_from_where_it_was_built():
    probes = {h: probe(h, image=image("", error="image not known")) for h in NODES}
    line = judge(probes, failed(*NODES))
    assert "give it the image: 'distrun push-image localhost/train:1' from the machine that built or pulled it" in line


def test_a_node_with_another_digest_is_blamed_against_the_majority():
    probes = {h: probe(h, image=image()) for h in NODES}
    probes["node3"]["image"] = image(B)
    line = judge(probes, failed("node3"))
    assert line.startswith(f"image: image {REF} on node3 is sha256:bbbbbbbbbbbb but sha256:aaaaaaaaaaaa on node1,node2 "
                           "on node3: give node3 the same image: 'distrun push-image localhost/train:1 --from node1'")


def test_every_node_holding_another_image_than_the_pushed_one_is_refused():
    """A job of the training account tagged an image of its own with the run's name on every node:
    the nodes agree with each other, not with what 'distrun push-image' put there."""
    probes = {h: probe(h, image=image(B, pushed=A)) for h in NODES}
    line = judge(probes, failed(*NODES))
    assert line.startswith(f"image: image {REF} on node1 is sha256:bbbbbbbbbbbb, not the sha256:aaaaaaaaaaaa 'distrun "
                           "push-image' put there (the training user's store is every job's: one can tag its own image "
                           f"{REF}) on node1: push it again from where it was built: 'distrun push-image {REF}'"), line
    probes = {h: probe(h, image=image(A, pushed=A)) for h in NODES}
    assert judge(probes, failed()) == ""


def test_a_missing_runtime_is_a_need_with_the_install_fix():
    probes = {h: probe(h, needs={"podman": {"ok": False, "detail": "not in PATH"}}) for h in NODES}
    line = judge(probes, failed(*NODES))
    assert line.startswith("needs: podman is not in PATH on node1, node2, node3: install the container runtime")


def test_a_run_with_an_image_asks_the_nodes_for_it_and_not_for_the_envs_modules():
    plain = plan_for(cluster(), run_id="r", launcher="torchrun", workload="ddp")
    boxed = plan_for(cluster(), run_id="r", launcher="torchrun", workload="ddp", container=Container(REF, "docker"))
    assert preflight_needs(plain)["preflight_image"] == {}
    needs = preflight_needs(boxed)
    # torchrun runs in the image: torch there (the DDP workload needs nothing more).
    assert needs["preflight_image"] == {"ref": REF, "runtime": "docker", "modules": ["torch"], "mpi": False, "torchrun": True}
    assert needs["preflight_modules"] == [] and needs["preflight_programs"] == {"docker": ["docker"]}


def run_probe_with_image(tmp_path: Path, ref: str, inside: dict | None = None) -> dict:
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    cfg = {"host": "here", "user": getpass.getuser(), "env_prefix": str(prefix), "mpi_prefix": "/usr",
           "shared_dir": str(tmp_path), "image": {"ref": ref, "runtime": "podman", **(inside or {})}}
    shipped = probe_text()  # as probe.yml ships it
    out = subprocess.run([sys.executable, "-c", shipped, json.dumps(cfg)], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["image"]


def local_image() -> str:
    if not shutil.which("podman"):
        pytest.skip("podman is not installed on this machine: the probe's image check needs it")
    out = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}} {{.Id}}"], capture_output=True,
                         text=True, timeout=60, check=False)
    named = [line.split() for line in out.stdout.splitlines() if not line.startswith("<none>")]
    if not named:
        pytest.skip("this user's podman holds no named image to inspect")
    return named[0][0]


def test_the_probe_reads_the_image_id_from_the_users_podman(tmp_path):
    ref = local_image()
    found = run_probe_with_image(tmp_path, ref)
    want = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()
    assert found["id"] == f"sha256:{want.removeprefix('sha256:')}" and found["ref"] == ref
    missing = run_probe_with_image(tmp_path / "2", "localhost/distrun-no-such-image:0")
    assert missing["id"] == "" and missing["error"]
    assert ref in missing["names"]  # what the store holds, for a "did you mean"


def test_the_probe_looks_inside_the_image_for_python3_and_the_modules(tmp_path):
    """A real container of a local image (the test nodes' image has python3): a module it lacks is
    named, one it has is not, and mpi4py's absence is said when the MPI is asked for."""
    ref = local_image()
    found = run_probe_with_image(tmp_path, ref, {"modules": ["json", "distrun_no_such_module"], "mpi": True})
    contents = found["contents"]
    if contents.get("error"):
        pytest.skip(f"this machine's podman cannot run {ref} here: {contents['error']}")
    assert contents["python"].count(".") == 2 and contents["missing"] == ["distrun_no_such_module"]
    assert "mpi4py" in contents["mpi_error"] and "mpi" not in contents
    # The shared folder, mounted and entered as the ranks do, is the node's own (device and inode).
    assert contents["folder"] and contents["folder"] == contents["folder_here"], contents
    assert found["driver"], found  # the runtime's storage driver, which check reports


def test_the_probe_runs_nothing_of_an_image_that_is_not_the_pushed_one(tmp_path):
    """The look inside runs the image's python3 as the training user, outside every unit: an image
    a job tagged with the run's name in place of the pushed one is never started."""
    ref = local_image()
    found = run_probe_with_image(tmp_path, ref, {"modules": ["json"], "id": "sha256:" + "0" * 64})
    assert found["pushed"] == "sha256:" + "0" * 64 and found["id"].startswith("sha256:") and "contents" not in found


def contents(**c) -> dict:
    return image(contents={"python": "3.11.2", "missing": [], **c})


def test_an_image_without_a_module_the_launcher_needs_is_named_with_the_install():
    probes = {h: probe(h, image=contents()) for h in NODES}
    probes["node2"]["image"] = contents(missing=["torch"])
    line = judge(probes, failed("node2"))
    assert line == ("image: image localhost/train:1: its python3 3.11.2 cannot import torch on node2: "
                    "install torch in the image (e.g. 'RUN python3 -m pip install torch' in its Containerfile) and "
                    "load it on every node again")


def test_an_image_whose_python3_does_not_run_is_refused():
    probes = {h: probe(h, image=image(contents={"error": "executable file `python3` not found in $PATH"})) for h in NODES}
    line = judge(probes, failed(*NODES))
    assert line.startswith("image: image localhost/train:1: its python3 did not run (executable file "
                           "`python3` not found in $PATH) on node1, node2, node3: build the image with python3")


def test_the_images_open_mpi_must_have_the_nodes_major_version():
    probes = {h: probe(h, image=contents(mpi="Open MPI v4.1.6, package: Open MPI builder")) for h in NODES}
    assert judge(probes, failed()) == ""  # the test nodes' Open MPI is 4.x
    probes["node3"]["image"] = contents(mpi="Open MPI v5.0.3, package: Open MPI builder")
    line = judge(probes, failed("node3"))
    assert "image localhost/train:1: its MPI is Open MPI v5.0.3" in line
    assert line.endswith("build the image with Open MPI 4.x, or use --launcher torchrun")
    probes["node3"]["image"] = contents(mpi_error="ModuleNotFoundError: No module named 'mpi4py'")
    assert "mpi4py finds no MPI library (ModuleNotFoundError" in judge(probes, failed("node3"))


def test_an_mpirun_run_asks_the_image_for_mpi4py_and_its_mpi():
    boxed = plan_for(cluster(), run_id="r", launcher="mpirun", workload="gcn-torch", container=Container(REF))
    assert preflight_needs(boxed)["preflight_image"] == {"ref": REF, "runtime": "podman", "modules": ["mpi4py", "torch"],
                                                         "mpi": True, "torchrun": False}


# --- containers as a new user meets them: (what the nodes' probes said, the refusal's fragments) ------------
FOLDER = {"folder": "64768:1201", "folder_here": "64768:1201"}
CASES_7 = [
    # The shared folder was mounted again after rootless podman's pause process started: inside its
    # containers it is another folder (or none), and the ranks would fail with 'cannot chdir'.
    ("a folder the pause process saw before it was mounted again", {"node2": contents(folder="2049:2", folder_here="47:1")},
     ("node2", "do not see the shared folder the node has", "device:inode 2049:2 inside, 47:1 on the node",
      "'podman system migrate' as distrun")),
    ("a container that cannot enter the folder", {"node3": image(contents={"error": "Error: crun: chdir to `/srv/distrun`: "
                                                                                   "No such file or directory"})},
     ("node3", "cannot chdir", "pause process of distrun", "'podman system migrate'")),
    ("a dead sshfs mount inside", {"node2": contents(folder_error="Transport endpoint is not connected: /srv/distrun")},
     ("node2", "Transport endpoint is not connected", "podman system migrate")),
    # Debian's python3-torch 1.13: its torchrun has no --local-addr, no --nproc-per-node.
    ("an image whose torch is too old for torchrun's flags", {h: contents(torch="1.13.1") for h in NODES},
     ("its torch is 1.13.1, older than the 2.0", "--local-addr", "node1, node2, node3", "torch 2.0 or newer")),
    # A name no node has: one sentence for every node, with the close names the stores hold.
    ("a name no node has", {h: image("", error="Error: localhost/trian:1: image not known",
                                     names=["localhost/train:1", "docker.io/library/python:3.11"]) for h in NODES},
     ("is not in podman's images of distrun; did you mean localhost/train:1? on node1, node2, node3",)),
]


@pytest.mark.parametrize("label,answers,expect", CASES_7, ids=[c[0] for c in CASES_7])
def test_containers_as_a_new_user_meets_them(label, answers, expect):
    probes = {h: probe(h, image=contents(**FOLDER, torch="2.3.1")) for h in NODES}
    for h, answer in answers.items():
        answer = dict(answer)
        answer["torchrun"] = True
        probes[h]["image"] = answer
    for p in probes.values():
        p["image"]["torchrun"] = True
    line = judge(probes, failed(*answers))
    assert all(f in line for f in expect), line
    assert line.count("\n") == 0 and len(line) < 600, (len(line), line)


def test_a_good_image_says_its_python_torch_and_a_copying_storage_driver():
    probes = {h: probe(h, image={**contents(**FOLDER, torch="2.3.1"), "torchrun": True, "driver": "vfs"}) for h in NODES}
    assert judge(probes, failed()) == ""
    judged = verdict(probes, head="node1", shared_mode="sync", shared_dir="/srv/distrun", setup=SETUP,
                     log_dir="/runs/R1/ansible")
    detail = judged["image"]["node1"].detail
    assert "python 3.11.2, torch 2.3.1" in detail and "storage vfs: every container start copies the whole image" in detail


def test_torch_older_than_torchruns_flags_is_fine_where_torchrun_does_not_run():
    probes = {h: probe(h, image={**contents(**FOLDER, torch="1.13.1"), "torchrun": False}) for h in NODES}
    assert judge(probes, failed()) == ""
