"""--workdir: which files go (git's ignore rules, translated for rsync), the rsync commands to the
head and from it, what rsync reported, and a real incremental sync on this machine."""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path

from distrun.inventory.cluster import cluster_from_json
from distrun.project.workdir import (
    LOCAL_RSH,
    node_path,
    parse_ignore,
    parse_stats,
    pull_argv,
    push,
    push_argv,
    read_rules,
    rsync_filters,
)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PROJECT = {
    ".gitignore": "*.pyc\n/data/*.bin\nout/\n**/b/*.tmp\nlogs/*.log\n!logs/keep.log\n# a comment\n\\#hash\n",
    "README.md": "r",
    "#hash": "ignored: an escaped # starts a pattern",
    "pkg/__init__.py": "",
    "pkg/model.py": "m",
    "pkg/model.pyc": "compiled",
    "pkg/sub/.distrunignore": "notes.txt\n",
    "pkg/sub/notes.txt": "n",
    "pkg/sub/test.tmp": "kept: no rule for it here",
    "pkg/out": "a file named out: 'out/' is for folders only",
    "data/d.csv": "1,2",
    "data/big.bin": "x" * 100,
    "data/sub/big.bin": "anchored /data/*.bin does not reach here",
    "out/o.txt": "o",
    "deep/.gitignore": "*.tmp\n!q.tmp\n",
    "deep/a/q.tmp": "re-included by the deeper file",
    "deep/a/b/z.tmp": "z",
    "logs/a.log": "a",
    "logs/keep.log": "k",
    ".git/HEAD": "ref",
    "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
    ".distrun_env": "SECRET=1\n",
}
KEPT = {".gitignore", "README.md", "pkg/__init__.py", "pkg/model.py", "pkg/sub/.distrunignore", "pkg/sub/test.tmp",
        "pkg/out", "data/d.csv", "data/sub/big.bin", "deep/.gitignore", "deep/a/q.tmp", "logs/keep.log"}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_ignore_rules_keep_what_git_would_keep(tmp_path):
    root = tree(tmp_path / "p", PROJECT)
    kept: list[str] = []
    rules, scan = read_rules(root, kept)
    assert set(kept) == KEPT
    assert scan.files == len(KEPT)
    assert scan.bytes == sum(len(PROJECT[f]) for f in KEPT)
    assert scan.ignore_files == (".gitignore", "deep/.gitignore", "pkg/sub/.distrunignore")
    assert not scan.large


def test_rsync_sends_exactly_those_files_and_never_deletes_ignored_ones(tmp_path):
    """The rules as rsync reads them decide like the scan (one translation, checked by rsync itself)."""
    root = tree(tmp_path / "p", PROJECT)
    rules, _ = read_rules(root)
    dest = tmp_path / "dest"
    argv = ["rsync", "--recursive", "--links", "--times", "--delete", *rsync_filters(rules), f"{root}/", f"{dest}/"]
    subprocess.run(argv, check=True)
    assert files_under(dest) == KEPT
    # On the receiving side, what the rules match is the node's own (outputs): never deleted;
    # a file the project does not have and does not ignore is deleted.
    tree(dest, {"out/result.txt": "a node's output", "pkg/cache.pyc": "c", "stray.txt": "not the project's"})
    subprocess.run(argv, check=True)
    assert files_under(dest) == KEPT | {"out/result.txt", "pkg/cache.pyc"}


def test_gitignore_lines_are_read_as_git_reads_them():
    r = parse_ignore("a/b\n/c\nd/\n!e\n\\!f\nspace\\ \ntrail   \n**/g\nh/**\ni**j\n", "sub")
    assert [(x.pattern, x.negate, x.dir_only, x.anchored) for x in r] == [
        ("a/b", False, False, True), ("c", False, False, True), ("d", False, True, False), ("e", True, False, False),
        ("!f", False, False, False), ("space ", False, False, False), ("trail", False, False, False),
        ("**/g", False, False, True), ("h/**", False, False, True), ("i*j", False, False, False)]
    assert all(x.base == "sub" for x in r)
    assert r[0].matches("sub/a/b", False) and not r[0].matches("a/b", False) and not r[0].matches("sub/x/a/b", False)
    assert r[7].matches("sub/g", False) and r[7].matches("sub/x/y/g", True)
    assert r[8].matches("sub/h/x/y", False) and not r[8].matches("sub/h", True)
    # rsync's '**/' needs a folder where git's does not: both forms are given.
    assert r[7].rsync_rules() == ["- /sub/**/g", "- /sub/g"]
    assert r[2].rsync_rules() == ["- /sub/**/d/", "- /sub/d/"]


def test_a_project_is_kept_per_folder_and_controller_under_the_shared_folder(tmp_path):
    one = tmp_path / "My Project!"
    one.mkdir()
    path = node_path("/srv/distrun/", one)
    assert path.startswith("/srv/distrun/workdirs/My-Project-")
    assert path == node_path("/srv/distrun", one)  # the second run finds the first's copy
    other = tmp_path / "b" / "My Project!"
    other.mkdir(parents=True)
    assert node_path("/srv/distrun", other) != path


def node(**hostvars):
    data = {"_meta": {"hostvars": {"n1": hostvars}}, "head": {"hosts": ["n1"]}, "workers": {"hosts": ["n1"]}}
    return cluster_from_json(Path("/inv"), data).head


def test_push_runs_rsync_over_the_inventorys_ssh_as_the_training_user(tmp_path):
    n = node(ansible_host="10.0.0.5", ansible_user="admin", ansible_port=2222, ansible_ssh_private_key_file="/k/id",
             ansible_ssh_common_args="-o UserKnownHostsFile=/k/known -o ProxyCommand='ssh -W %h:%p bastion'")
    argv = push_argv(n, "distrun", tmp_path, "/srv/distrun/workdirs/p-1", ["--filter=- .git"])
    assert argv[0] == "rsync" and "--delete" in argv and "--chmod=go-w,o-rwx" in argv
    assert argv[-2:] == [f"{tmp_path.resolve()}/", "admin@10.0.0.5:/srv/distrun/workdirs/p-1/"]
    assert argv[-3] == "--filter=- .git"
    rsh = next(a for a in argv if a.startswith("--rsh="))
    # rsync splits --rsh itself and honours only double quotes: a value with spaces is quoted so.
    assert rsh.endswith('-o UserKnownHostsFile=/k/known -o "ProxyCommand=ssh -W %h:%p bastion" -p 2222 -i /k/id')
    path = next(a for a in argv if a.startswith("--rsync-path="))
    assert "u=distrun; d=/srv/distrun/workdirs/p-1;" in path and 'sudo -n -u "$u"' in path and 'runuser -u "$u"' in path
    v6 = push_argv(node(ansible_host="fd00::5"), "distrun", tmp_path, "/w", [])
    assert v6[-1] == "[fd00::5]:/w/"


def test_pull_protects_the_nodes_ignored_files_and_takes_everything_else_from_the_head():
    argv = pull_argv("node1", "/srv/distrun/workdirs/p-1", ["--filter=- .git", "--filter=- __pycache__/",
                                                           "--filter=+ /keep.log", "--filter=- *.log"],
                      "/srv/distrun/runs/r1/attempts/0/mesh-key")
    assert argv[-2:] == ["node1:/srv/distrun/workdirs/p-1/", "/srv/distrun/workdirs/p-1/"]
    assert ["--filter=- .git", "--filter=- __pycache__/", "--filter=R /keep.log", "--filter=P *.log"] == [
        a for a in argv if a.startswith("--filter")]
    assert "--delete" in argv and "--mkpath" in argv
    # The system's ssh configuration only, and the attempt's certificate (the run's hosts, minutes).
    assert ("--rsh=ssh -F /etc/ssh/ssh_config -o BatchMode=yes -i /srv/distrun/runs/r1/attempts/0/mesh-key") in argv


RSYNC_OUTPUT = """\
<f.st...... mypkg/model.py
*deleting   old.py
cd+++++++++ newdir/

Number of files: 9 (reg: 7, dir: 2)
Number of created files: 1 (dir: 1)
Number of deleted files: 1 (reg: 1)
Number of regular files transferred: 1
Total file size: 12,345 bytes
Total transferred file size: 1,234 bytes
Total bytes sent: 700
Total bytes received: 35
"""


def test_rsync_stats_are_read_into_the_record():
    s = parse_stats(RSYNC_OUTPUT)
    assert (s.files_transferred, s.deleted, s.total_size, s.transferred_size, s.bytes_sent) == (1, 1, 12345, 1234, 700)
    assert s.changed == ["mypkg/model.py"] and s.removed == ["old.py"]
    # rsync 2.6's words.
    assert parse_stats("Number of files transferred: 3\nTotal file size: 10 bytes\n").files_transferred == 3


def test_a_second_push_sends_only_the_file_that_changed(tmp_path):
    """The real controller-side rsync, to this machine (ansible_connection=local) as this user."""
    root = tree(tmp_path / "p", {"pkg/a.py": "a", "pkg/b.py": "b", "conf.json": "{}", "out/x": "ignored", ".gitignore": "out/\n"})
    rules, _ = read_rules(root)
    filters = rsync_filters(rules)
    here = node(ansible_connection="local")
    target = str(tmp_path / "shared" / "workdirs" / "p-1")
    first = push(here, getpass.getuser(), root, target, filters)
    assert first.files_transferred == 4 and sorted(first.changed) == [".gitignore", "conf.json", "pkg/a.py", "pkg/b.py"]
    assert files_under(Path(target)) == {".gitignore", "conf.json", "pkg/a.py", "pkg/b.py"}
    assert oct(os.stat(target).st_mode & 0o777) == "0o750"  # others read no project
    (root / "pkg" / "b.py").write_text("b, changed")
    os.utime(root / "pkg" / "b.py", (1, 1))
    second = push(here, getpass.getuser(), root, target, filters)
    assert second.files_transferred == 1 and second.changed == ["pkg/b.py"]
    assert LOCAL_RSH[0] == "sh"


def test_a_nodes_pull_brings_the_heads_prepare_output_and_keeps_its_own_outputs(tmp_path):
    """The pull's rules run by the real rsync, here between two local folders."""
    project = {".gitignore": "prepared/\nout/\n", "train.py": "t", "old.py": "removed from the project later"}
    rules, _ = read_rules(tree(tmp_path / "laptop", project))
    head = tree(tmp_path / "head", {**project, "prepared/part-0.txt": "written by --prepare on the head",
                                    "pkg/__pycache__/m.pyc": "the head's bytecode"})
    node = tmp_path / "node"
    argv = pull_argv("head", "/unused", rsync_filters(rules), "/unused/mesh-key")
    argv[-2:] = [f"{head}/", f"{node}/"]
    subprocess.run(argv, check=True, capture_output=True)
    assert files_under(node) == {".gitignore", "train.py", "old.py", "prepared/part-0.txt"}
    tree(node, {"out/rank1.txt": "the node's own output", "pkg/__pycache__/m.pyc": "the node's bytecode"})
    (head / "old.py").unlink()
    stats = parse_stats(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    assert files_under(node) == {".gitignore", "train.py", "prepared/part-0.txt", "out/rank1.txt", "pkg/__pycache__/m.pyc"}
    assert stats.removed == ["old.py"] and stats.files_transferred == 0
