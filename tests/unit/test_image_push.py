"""`distrun push-image`: an image into every node's store, by id, with nothing moved twice.

Each node is a local shell with its own image store (a folder), and ``podman`` on PATH is a
stand-in runtime that keeps images there: ``image inspect`` prints a stored image's id,
``save`` writes an archive holding the reference, the id and a body of the image's size, ``load``
stores what an archive holds (a truncated archive stores nothing, as a real load fails). Every
load is counted per node. What the tests hold: which nodes get bytes, that the archive is saved
once and reused, the ids afterwards, and each failure as one line naming the node and the fix."""

from __future__ import annotations

import getpass
import json
import os
import stat
from pathlib import Path

import jsonschema
import pytest

from distrun import paths
from distrun.errors import UserError
from distrun.planning.jobplan import from_json, to_json
from distrun.planning.needs import preflight_needs
from distrun.project import image_push
from distrun.store import images
from distrun.transport import remote

from .plans import plan_for
from .test_launchers import cluster

REF = "localhost/train:1"
ID_A = "a" * 64
ID_B = "b" * 64

RUNTIME = r"""#!/bin/bash
# A stand-in podman: images are files "$STORE/<ref with / and : as _>" holding the id.
set -u
key() { printf '%s' "$1" | tr '/:' '__'; }
case "$1 $2" in
  "image inspect")
    echo "time=\"2026-11-27T22:00:00Z\" level=warning msg=\"The cgroupv2 manager is set to systemd but there is no systemd user session available\"" >&2
    f="$STORE/$(key "$5")"; [ -f "$f" ] && { echo "sha256:$(cat "$f")"; exit 0; }
    echo "Error: $5: image not known" >&2; exit 125 ;;
esac
case "$1" in
  save) f="$STORE/$(key "$2")"; [ -f "$f" ] || { echo "Error: $2: image not known" >&2; exit 125; }
        printf 'ARCHIVE %s %s\n' "$2" "$(cat "$f")"; head -c 4096 /dev/zero; exit 0 ;;
  load) [ -n "${FAIL_LOAD:-}" ] && { cat >/dev/null; echo "Error: payload does not match: disk full" >&2; exit 125; }
        read -r word ref id; [ "$word" = ARCHIVE ] || { echo "Error: not an archive" >&2; exit 125; }
        body=$(wc -c); [ "$body" -ge 4096 ] || { echo "Error: unexpected EOF" >&2; exit 125; }
        echo "$id" > "$STORE/$(key "$ref")"; echo load >> "$STORE/.loads"; echo "Loaded image: $ref" ;;
  *) echo "stand-in podman: $*: not known" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Three nodes (n1..n3), each a local shell with its own store; this machine's store too."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runtime = bin_dir / "podman"
    runtime.write_text(RUNTIME)
    runtime.chmod(runtime.stat().st_mode | stat.S_IEXEC)
    stores = {h: tmp_path / "stores" / h for h in ("here", "n1", "n2", "n3")}
    for s in stores.values():
        s.mkdir(parents=True)
    down: set[str] = set()
    failing: set[str] = set()

    def shell_argv(node, command, *, master=False):
        if node.name in down:
            return ["sh", "-c", "echo 'ssh: connect to host 10.0.0.3 port 22: No route to host' >&2; exit 255"]
        env = [f"STORE={stores[node.name]}", f"PATH={bin_dir}:{os.environ['PATH']}"]
        env += ["FAIL_LOAD=1"] if node.name in failing else []
        return ["env", *env, "bash", "-c", command]

    monkeypatch.setattr(remote, "shell_argv", shell_argv)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STORE", str(stores["here"]))
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    hosts = {h: {"ansible_host": f"10.0.0.{k}"} for k, h in enumerate(("n1", "n2", "n3"), 1)}
    c = cluster(hosts, distrun_user=getpass.getuser())

    def put(where: str, image_id: str) -> None:
        (stores[where] / REF.replace("/", "_").replace(":", "_")).write_text(image_id + "\n")

    def loads(where: str) -> int:
        f = stores[where] / ".loads"
        return len(f.read_text().split()) if f.exists() else 0

    return c, put, loads, down, failing


def test_only_the_nodes_without_the_image_get_it_and_a_second_push_moves_nothing(world):
    c, put, loads, _, _ = world
    put("here", ID_A)
    put("n1", ID_A)  # has it
    put("n3", ID_B)  # another image under the name
    first = image_push.push(c, REF)
    got = {n.host: (n.before, n.after, n.moved > 0) for n in first.nodes}
    assert got == {"n1": (ID_A, ID_A, False), "n2": ("", ID_A, True), "n3": (ID_B, ID_A, True)}
    assert first.saved and first.source == "this machine" and not first.failed
    assert [loads(h) for h in ("n1", "n2", "n3")] == [0, 1, 1]
    archive = Path(first.archive)
    assert archive.name == f"{ID_A}.tar" and first.moved == 2 * archive.stat().st_size
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    second = image_push.push(c, REF)
    assert second.moved == 0 and not second.saved and second.archive == ""
    assert {n.host: n.moved for n in second.nodes} == {"n1": 0, "n2": 0, "n3": 0}
    assert [loads(h) for h in ("n1", "n2", "n3")] == [0, 1, 1]


def test_a_push_pins_the_runs_image_to_its_id_on_this_inventory_only(world, tmp_path):
    """What push-image put on the nodes is what a later run asks every node for (the preflight's
    image check); a failed push pins nothing, and another inventory's runs are not pinned."""
    c, put, _, _, failing = world
    put("here", ID_A)
    failing.add("n2")
    image_push.push(c, REF)
    assert images.pushed_id(c.source, REF, "podman") == ""
    failing.clear()
    image_push.push(c, REF)
    assert images.pushed_id(c.source, REF, "podman") == f"sha256:{ID_A}"
    assert images.pushed_id(tmp_path / "other" / "hosts.yml", REF, "podman") == ""
    plan = plan_for(c, run_id="r1", inventory=c.source, image=REF, script=tmp_path / "t.py")
    assert plan.launch.container is not None and plan.launch.container.image_id == f"sha256:{ID_A}"
    assert preflight_needs(plan)["preflight_image"]["id"] == f"sha256:{ID_A}"
    assert to_json(plan)["container"] == {"image": REF, "runtime": "podman", "image_id": f"sha256:{ID_A}"}
    assert from_json(to_json(plan)) == plan
    put("here", ID_B)
    image_push.push(c, REF)  # a new build of the name: runs want it from now on
    assert images.pushed_id(c.source, REF, "podman") == f"sha256:{ID_B}"
    assert stat.S_IMODE(paths.pushed_images_file(c.source).parent.stat().st_mode) == 0o700


def test_a_node_that_lost_the_image_gets_the_cached_archive_without_a_new_save(world, tmp_path):
    c, put, loads, _, _ = world
    put("here", ID_A)
    first = image_push.push(c, REF)
    archive = Path(first.archive)
    (tmp_path / "stores" / "here" / "localhost_train_1").unlink()  # gone from this machine: the archive stays
    (tmp_path / "stores" / "n2" / "localhost_train_1").unlink()
    with pytest.raises(UserError, match="not in this machine's podman images"):
        image_push.push(c, REF)
    put("here", ID_A)
    again = image_push.push(c, REF)
    assert not again.saved and again.archive == str(archive)
    assert {n.host: n.moved > 0 for n in again.nodes} == {"n1": False, "n2": True, "n3": False}
    assert loads("n2") == 2


def test_from_a_node(world):
    c, put, loads, _, _ = world
    put("n2", ID_B)
    res = image_push.push(c, REF, from_node="n2")
    assert res.source == "n2" and res.image_id == ID_B
    assert {n.host: n.after for n in res.nodes} == dict.fromkeys(("n1", "n2", "n3"), ID_B)
    assert [loads(h) for h in ("n1", "n2", "n3")] == [1, 0, 1]


@pytest.mark.parametrize("from_node, line", [
    (None, "image localhost/train:1 is not in this machine's podman images: build or pull it here "
           "('podman build -t localhost/train:1 .', 'podman pull localhost/train:1'), or name a node that has it "
           "with --from NODE"),
    ("n1", "image localhost/train:1 is not in podman's images of"),
    ("n9", "--from n9: no such node in inventory /inv/hosts.yml; name one of n1, n2, n3"),
])
def test_a_source_without_the_image_is_one_line_and_nothing_moves(world, from_node, line):
    c, _, loads, _, _ = world
    with pytest.raises(UserError) as exc:
        image_push.push(c, REF, from_node=from_node)
    assert line in str(exc.value) and "\n" not in str(exc.value)
    assert [loads(h) for h in ("n1", "n2", "n3")] == [0, 0, 0]


def test_an_unreachable_node_stops_the_push_before_anything_moves(world):
    c, put, loads, down, _ = world
    put("here", ID_A)
    down.add("n3")
    with pytest.raises(UserError) as exc:
        image_push.push(c, REF)
    assert str(exc.value).startswith("n3: no answer (ssh: connect to host 10.0.0.3 port 22: No route to host)")
    assert "nothing was pushed" in str(exc.value)
    assert [loads(h) for h in ("n1", "n2")] == [0, 0]


def test_a_failed_load_is_named_and_the_others_still_get_the_image(world):
    c, put, _, _, failing = world
    put("here", ID_A)
    failing.add("n2")
    res = image_push.push(c, REF)
    assert [n.host for n in res.failed] == ["n2"]
    assert res.failed[0].error == f"'podman load' as {getpass.getuser()} failed: Error: payload does not match: disk full"
    assert {n.host: n.after for n in res.nodes} == {"n1": ID_A, "n2": "", "n3": ID_A}


def test_the_command_line_prints_what_moved_and_exits_1_naming_a_failed_node(world, tmp_path):
    from click.testing import CliRunner

    from distrun.cli.main import main

    c, put, _, _, failing = world
    put("here", ID_A)
    inv = tmp_path / "inv.yml"
    inv.write_text(json.dumps({"all": {"vars": {"distrun_user": getpass.getuser()}, "children": {
        "head": {"hosts": {"n1": {"ansible_host": "10.0.0.1"}}},
        "workers": {"hosts": {h: {"ansible_host": f"10.0.0.{k}"} for k, h in enumerate(("n1", "n2", "n3"), 1)}}}}}))
    runner = CliRunner()
    first = runner.invoke(main, ["push-image", REF, "--inventory", str(inv)], standalone_mode=False)
    assert first.exit_code == 0, first.output
    lines = first.output.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [f"{h}: loaded aaaaaaaaaaaa" for h in ("n1", "n2", "n3")]
    assert lines[3].startswith(f"{REF} aaaaaaaaaaaa: ") and "moved to 3 of 3 node(s); saved from this machine" in lines[3]
    second = runner.invoke(main, ["push-image", REF, "--inventory", str(inv), "--json"], standalone_mode=False)
    data = json.loads(second.output)
    schema = json.loads((Path(__file__).parents[2] / "docs" / "guide" / "distrun-json.schema.json").read_text())
    jsonschema.validate(data, {**schema, "$ref": "#/$defs/push_image"})  # what cli.md documents
    assert data["moved_bytes"] == 0 and data["saved"] is False and data["id"] == f"sha256:{ID_A}"
    assert {n["host"]: n["moved_bytes"] for n in data["nodes"]} == {"n1": 0, "n2": 0, "n3": 0}
    (tmp_path / "stores" / "n3" / "localhost_train_1").unlink()
    failing.add("n3")
    third = runner.invoke(main, ["push-image", REF, "--inventory", str(inv)], standalone_mode=False)
    assert third.exit_code == 1
    assert "n3: FAILED: 'podman load' as" in third.output
