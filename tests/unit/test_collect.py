"""What a run brings home when it ends, and 'distrun fetch' for what it leaves on the nodes.

The node side is the real command (find + tar through bash) on a local run directory; the node is
this machine through ansible_connection=local, as in inventory/local.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import UserError
from distrun.inventory.cluster import cluster_from_json
from distrun.run import collect, collect_rules
from distrun.run.ending import collect_limits
from distrun.run.fetch import check_path, holders
from distrun.store.runs import new_run

MIB = 1 << 20


def local_cluster():
    data = {"_meta": {"hostvars": {"n1": {"ansible_connection": "local", "distrun_user": getpass.getuser()}}},
            "all": {"children": ["head", "workers"]}, "head": {"hosts": ["n1"]}, "workers": {"hosts": ["n1"]}}
    return cluster_from_json(Path("/inv/hosts.yml"), data, None)


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)  # sparse: as many bytes as a real file for find, tar and the listing


# What a run dir holds after an mpirun run and one restart: size, and whether it comes home.
REPO = Path(__file__).resolve().parents[2]
RUN_DIR = {
    "attempts/1/launcher-n1.log": (300, True),
    "attempts/1/launcher-n1.pid": (5, True),
    "attempts/1/exitcode-n1": (2, True),
    "hostfile": (30, True),
    "train.py": (4000, True),
    "attempts/1/ranks/1/rank.0/stdout": (3 * MIB, True),  # a big rank log: a log, whatever its size
    "attempts/1/ranks/1/rank.0/stderr": (0, True),
    "attempts/0/ranks/1/rank.0/stdout": (2 * MIB, True),  # a failed attempt's log
    "attempts/0/launcher-n1.log": (2 * MIB, True),
    "attempts/1/torchrun/n1/x_1/attempt_0/0/stdout.log": (2 * MIB, True),
    "attempts/1/slurm-42.out": (2 * MIB, True),
    "metrics/train.log": (2 * MIB, True),  # the job's own log, by its name
    "result.json": (200, True),  # small: comes
    "out/eval.csv": (MIB, True),  # exactly the small size: comes
    "out/model.pt": (MIB + 1, False),  # one byte over: stays, listed
    "out/opt/state.pt": (5 * MIB, False),
    "weights.bin": (7 * MIB, False),
}


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "srv" / "runs" / "r1"
    for name, (size, _) in RUN_DIR.items():
        write(d / name, size)
    os.symlink("/etc/hostname", d / "link.txt")  # a link: neither brought nor listed
    return d


def test_a_run_brings_its_logs_and_small_files_and_lists_what_stays(run_dir, tmp_path):
    dest = tmp_path / "dest"
    pulled = collect.pull_run(local_cluster(), str(run_dir), ["n1"], dest, collect_rules.run_end_selection())
    assert pulled.errors == {}
    brought = {str(p.relative_to(dest / "n1")) for p in (dest / "n1").rglob("*") if p.is_file()}
    assert brought == {name for name, (_, comes) in RUN_DIR.items() if comes}
    staying = {name: size for name, (size, comes) in RUN_DIR.items() if not comes}
    assert dict((p, s) for s, p in pulled.left["n1"].files) == staying
    assert pulled.left["n1"].size == 13 * MIB + 1 and not pulled.left["n1"].more
    assert pulled.brought["n1"] == (len(brought), sum(s for s, c in RUN_DIR.values() if c))
    record = json.loads(collect_rules.left_record(str(run_dir), pulled.left))
    assert record["run_dir"] == str(run_dir)
    assert [f["path"] for f in record["hosts"]["n1"]["files"]] == ["weights.bin", "out/opt/state.pt", "out/model.pt"]
    assert record["hosts"]["n1"]["bytes"] == 13 * MIB + 1


def test_the_listing_stops_at_its_limit(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "LIST_MAX", 2)
    pulled = collect.pull_run(local_cluster(), str(run_dir), ["n1"], tmp_path / "d", collect_rules.run_end_selection())
    assert len(pulled.left["n1"].files) == 2 and pulled.left["n1"].more


def find_test(sel: collect_rules.Selection) -> str:
    """The selection as a find(1) expression: patterns as -path, the small size as -size."""
    paths = " -o ".join(f"-path {shlex.quote('./' + p)}" for p in sel.patterns)
    if sel.small:
        paths += f" -o -size -{collect_rules.SMALL_BYTES + 1}c"
    never = " -o ".join(f"-path {shlex.quote('./' + p)}" for p in sel.never)
    return f"\\( {paths} \\)" + (f" ! \\( {never} \\)" if never else "")


def test_the_playbooks_fallback_applies_the_same_rule(run_dir):
    """The collect playbook (for a node the stream could not bring) keeps a file when the
    selection's regex matches './<path>' or it is at most SMALL_BYTES: the same files as find."""
    sel = collect_rules.run_end_selection()
    regex, never = re.compile(sel.regex()), re.compile(sel.never_regex())
    write(run_dir / "attempts" / "0" / "mesh-key", 400)  # small, an attempt's own: and never brought
    names = [*RUN_DIR, "attempts/0/mesh-key"]
    sizes = {**{name: size for name, (size, _) in RUN_DIR.items()}, "attempts/0/mesh-key": 400}
    by_regex = {name for name in names if (regex.match("./" + name) or sizes[name] <= collect_rules.SMALL_BYTES)
                and not never.match("./" + name)}
    out = subprocess.run(["bash", "-c", f"cd {run_dir} && find . -type f {find_test(sel)} -printf '%P\\n'"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert by_regex == set(out) == {name for name, (_, comes) in RUN_DIR.items() if comes}
    # the role's default rule (its fallback without the runner's extra-var) says the same
    default = yaml.safe_load((REPO / "roles" / "job" / "defaults" / "main.yml").read_text())["job_collect_never"]
    found = re.search(r"default\('(.*)'\)", default)
    assert found, default
    role = re.compile(found.group(1).replace("\\\\", "\\"))
    for name in [*names, "mesh-key", "attempts/12/mesh-key", "attempts/0/mesh-key.pub", "out/mesh-key", "attempts/a/b/mesh-key"]:
        assert bool(role.match("./" + name)) == bool(never.match("./" + name)), name



def test_listing_records_from_a_node_are_not_trusted():
    import io

    stream = io.BytesIO(b"12\tgood/file\0x\tbad-size\0" + b"7\0" + b"5\tok\0\0" + b"TAR")
    left, rest = collect.read_listing(stream)
    assert left.files == [(12, "good/file"), (5, "ok")] and rest == b"TAR"
    empty, rest = collect.read_listing(io.BytesIO(b"\0TAR"))
    assert empty.files == [] and rest == b"TAR"
    with pytest.raises(EOFError):
        collect.read_listing(io.BytesIO(b"12\tcut"))


def test_fetch_brings_a_folder_a_file_or_a_glob(run_dir, tmp_path):
    for i, (paths, expect) in enumerate([
        (["out"], {"out/eval.csv", "out/model.pt", "out/opt/state.pt"}),
        (["weights.bin"], {"weights.bin"}),
        (["out/*.pt"], {"out/model.pt", "out/opt/state.pt"}),  # as find's -path: '*' matches across folders
        (["*.csv"], {"out/eval.csv"}),
        (["out/opt", "weights.bin"], {"out/opt/state.pt", "weights.bin"}),
    ]):
        dest = tmp_path / f"f{i}"
        pulled = collect.pull_run(local_cluster(), str(run_dir), ["n1"], dest, collect_rules.path_selection(paths))
        assert pulled.errors == {} and pulled.left == {}
        got = {str(p.relative_to(dest / "n1")) for p in (dest / "n1").rglob("*") if p.is_file()}
        assert got == expect, paths
        assert (dest / "n1" / sorted(expect)[0]).stat().st_size == RUN_DIR[sorted(expect)[0]][0]


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "out/../../x", "", "./", "a\nb"])
def test_fetch_refuses_a_path_outside_the_run_dir(path):
    with pytest.raises(UserError, match="give a path inside the run directory"):
        check_path(path)


def test_fetch_asks_the_nodes_the_record_lists_the_path_on(private_state):
    run = new_run("train", Path("/inv/hosts.yml"))
    run.write(collect_rules.LEFT_FILE, json.dumps({"run_dir": "/srv/runs/r", "hosts": {
        "n1": {"files": [{"path": "out/model.pt", "size": 9}], "more": False, "bytes": 9},
        "n2": {"files": [{"path": "ckpt/e1/a.pt", "size": 9}], "more": False, "bytes": 9}}}))
    assert holders(run, ["out/model.pt"]) == ["n1"]
    assert holders(run, ["ckpt"]) == ["n2"]
    assert holders(run, ["out/*"]) == ["n1"]
    assert holders(run, ["*.pt"]) == ["n1", "n2"]
    assert holders(run, ["nothing"]) == []


def test_fetch_of_a_run_that_never_reached_its_nodes_is_one_line(private_state):
    run = new_run("train", Path("/inv/hosts.yml"))
    run.finish(2, "refused")
    result = CliRunner().invoke(main, ["fetch", run.id, "out"], prog_name="distrun")
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no plan.json" in lines[0], result.stderr


def test_collect_stops_at_a_file_count_and_says_where_the_rest_is(tmp_path, monkeypatch):
    """Bytes and time do not bound a job's thousands of empty files: the count does, on the node's
    side (its packer stops one past the cap) and on this side, with one line naming what stayed."""
    d = tmp_path / "srv" / "runs" / "r1"
    for i in range(60):
        write(d / "many" / f"f{i:03}.txt", 0)
    script = collect.pack_command(str(d), getpass.getuser(), collect_rules.run_end_selection(), max_files=20)
    packed = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    tar_start = packed.index(b"\0") + 1  # no listing: every empty file is selected
    members = subprocess.run(["tar", "-tzf", "-"], input=packed[tar_start:], capture_output=True, check=True).stdout
    assert len(members.splitlines()) == 21

    monkeypatch.setenv("DISTRUN_COLLECT_MAX_FILES", "20")
    dest = tmp_path / "dest"
    pulled = collect.pull_run(local_cluster(), str(d), ["n1"], dest, collect_rules.run_end_selection(),
                              **collect_limits())
    assert len(list((dest / "n1" / "many").iterdir())) == 20 and pulled.brought["n1"] == (20, 0)
    error = pulled.errors["n1"]
    assert error.kind == collect.Failure.CAPPED and error.final and "the cap of 20 files" in error.why
    assert f"the rest stays in {d} on n1" in error.why and "DISTRUN_COLLECT_MAX_FILES" in error.why
    assert "distrun fetch" in str(error)


def test_collect_brings_no_deep_folder_chains_and_no_name_that_is_not_text(tmp_path):
    """A few files at the end of long folder chains would make the controller thousands of folders
    (a file cap does not count them), and a name with control bytes or bytes that are not UTF-8
    would be stored as it is: the node's packer walks no deeper than the cap and packs no such
    name, and this side stops at the entries' cap and stores no such name either."""
    d = tmp_path / "srv" / "runs" / "r1"
    for c in range(5):
        write(d / "deep" / f"c{c}" / Path(*["d"] * 50) / "f", 1)
    write(d / "shallow" / "a" / "b" / "ok.txt", 3)
    base = os.fsencode(d)
    for name in (b"ctl-\x1b[2J\x07", b"bad-\xff\xfe"):
        with open(os.path.join(base, name), "wb") as fh:
            fh.write(b"x")
    pulled = collect.pull_run(local_cluster(), str(d), ["n1"], tmp_path / "dest", collect_rules.run_end_selection(),
                              max_depth=8)
    got = sorted(str(p.relative_to(tmp_path / "dest" / "n1")) for p in (tmp_path / "dest" / "n1").rglob("*"))
    assert got == ["shallow", "shallow/a", "shallow/a/b", "shallow/a/b/ok.txt"], got
    assert pulled.errors == {}
    stayed = [p for _, p in pulled.left["n1"].files]
    assert sorted(stayed) == ["bad-\\xff\\xfe", "ctl-\\x1b[2J\\x07"], stayed  # escaped, on the node
    # Under a cap of entries: files and the folders they need count alike.
    for i in range(30):
        write(d / "wide" / f"w{i:02}" / "x" / "f", 1)
    capped = collect.pull_run(local_cluster(), str(d), ["n1"], tmp_path / "d2", collect_rules.run_end_selection(),
                              max_entries=40)
    made = list((tmp_path / "d2" / "n1").rglob("*"))
    assert len(made) <= 40, len(made)
    error = capped.errors["n1"]
    assert error.kind == collect.Failure.CAPPED and "the cap of 40 files and folders" in error.why
    assert "DISTRUN_COLLECT_MAX_ENTRIES" in error.why
