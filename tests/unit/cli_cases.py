"""More odd or bad invocations for test_cli_args's table, written from what users and scripts
type: every verb, options before the verb, empty selections, options that do nothing in their
combination, launcher arguments that repeat what distrun sets, non-ASCII digits, inventories
with duplicate addresses or nothing in them, state folders that cannot hold state. Nothing here
reaches a host: the inventories name unroutable TEST-NET addresses (192.0.2.0/24) or none."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .conftest import REPO

TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")
T = ["train", "-i", TWO]
D = [*T, "--dry-run"]
P = ["partition", "-i", TWO]

Argv = Callable[[Path], list[str]]
# (label, argv, fragments the one error line holds, env, reads an inventory, exit code)
Case = tuple[str, Argv, tuple[str, ...], dict[str, str | None], bool, int]
CASES: list[Case] = []


def add(label: str, argv: Argv, expect: tuple[str, ...], env: dict[str, str | None] | None = None,
        reads_inventory: bool = False, code: int = 2) -> None:
    CASES.append((label, argv, expect, env or {}, reads_inventory, code))


def fixed(words: list[str]) -> Argv:
    return lambda t: list(words)


def with_workdir(words: list[str]) -> Argv:
    return lambda t: [*D, "--workdir", str(t), *words, "--", "python", "x.py"]


def empty_folder(verb: str) -> Argv:
    def argv(t: Path) -> list[str]:
        (t / "inv").mkdir()
        return [verb, "-i", str(t / "inv")]
    return argv


def only_group_vars(verb: str) -> Argv:
    return lambda t: [verb, "-i", str(Path(write(t, "inv/group_vars/all.yml", "x: 1\n")).parents[1])]


def inventory_file(verb: str, text: str) -> Argv:
    return lambda t: [verb, "-i", write(t, "hosts.ini", text)]


def dry_inventory(text: str) -> Argv:
    return lambda t: ["train", "-i", write(t, "hosts.ini", text), "--dry-run"]


def write(t: Path, name: str, text: str) -> str:
    p = t / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return str(p)


VERBS = ["setup", "check", "train", "partition", "hostfile", "logs", "fetch", "stop", "runs", "show", "status",
         "attach", "init", "push-image"]

# --- options before the verb: "put it after the verb" ---------------------------------------
for verb, opt in [("train", ["-i", "local"]), ("check", ["--inventory", "local"]), ("setup", ["-i", "local"]),
                  ("runs", ["--json"]), ("show", ["--json"]), ("status", ["--json"]), ("logs", ["--follow"]),
                  ("logs", ["--rank", "1"]), ("hostfile", ["-i", "local"]), ("partition", ["--np", "2"]),
                  ("train", ["--dry-run"]), ("runs", ["--prune"]), ("fetch", ["--host", "w1"]),
                  ("init", ["--head", "a"]), ("train", ["--inventory=local"]), ("check", ["--json"])]:
    add(f"{opt[0]} before {verb}", fixed([*opt, verb]), (f"{opt[0]}", f"an option of '{verb}'", "after the verb"))
for verb in VERBS:
    add(f"unknown option before {verb}", fixed(["--colour", verb]), ("no such option --colour", f"'distrun {verb} --help'"))
add("only an option", fixed(["--quiet"]), ("--quiet before any command", "give a command first"))
add("a word that is no verb", fixed(["provision"]), ("no such command 'provision'", "'distrun --help'"))
add("a verb in capitals", fixed(["TRAIN"]), ("no such command 'TRAIN'", "did you mean train"))
add("a verb with a typo (sho)", fixed(["sho"]), ("no such command 'sho'", "did you mean show"))
add("a verb with a typo (stauts)", fixed(["stauts"]), ("no such command 'stauts'", "did you mean status"))
add("a verb with a typo (atach)", fixed(["atach"]), ("no such command 'atach'", "did you mean attach"))

# --- misspelt options, every verb -------------------------------------------------------------
for verb, typo, right in [("setup", "--limt", "--limit"), ("setup", "--chekc", "--check"), ("check", "--inventroy", "--inventory"),
                          ("train", "--launchr", "--launcher"), ("train", "--workdri", "--workdir"),
                          ("train", "--detatch", "--detach"), ("train", "--host", "--hosts"),
                          ("train", "--exlude", "--exclude"), ("train", "--max-restart", "--max-restarts"),
                          ("partition", "--datset", "--dataset"), ("hostfile", "--inventory-file", "--inventory"),
                          ("logs", "--rnak", "--rank"), ("fetch", "--hsot", "--host"), ("runs", "--prun", "--prune"),
                          ("show", "--jason", "--json"), ("status", "--jsn", "--json"), ("init", "--worker", "--workers"),
                          ("init", "--haed", "--head")]:
    base = {"train": D, "partition": P, "setup": ["setup", "-i", TWO], "check": ["check", "-i", TWO],
            "hostfile": ["hostfile", "-i", TWO]}.get(verb, [verb])
    add(f"{verb}: misspelt {right}", fixed([*base, typo]), (f"no such option {typo}", f"did you mean {right}"))

# --- stray arguments ------------------------------------------------------------------------------
for verb in ["setup", "check", "hostfile", "partition"]:
    add(f"{verb}: stray argument", fixed([verb, "-i", TWO, "now"]), ("unexpected argument 'now'", "--help"))
for verb in ["status", "attach", "show", "logs", "stop"]:
    add(f"{verb}: two run ids", fixed([verb, "last", "last"]), ("unexpected argument 'last'", "--help"))
add("push-image: no image", fixed(["push-image", "-i", TWO]), ("push-image: missing argument 'IMAGE'", "--help"))
add("push-image: not an image reference", fixed(["push-image", "Ubuntu:22.04", "-i", TWO]),
    ("push-image: IMAGE 'Ubuntu:22.04' is not an image reference", "in lower case"))
add("push-image: an option as the image", fixed(["push-image", "-i", TWO, "--", "--rm"]),
    ("push-image: IMAGE '--rm' is not an image reference",))
add("push-image: --from a node not there", fixed(["push-image", "localhost/x:1", "-i", TWO, "--from", "w9"]),
    ("--from w9: no such node in inventory", "name one of w1, w2"), reads_inventory=True)
add("push-image: a verb with a typo", fixed(["push-imag"]), ("no such command 'push-imag'", "did you mean push-image"))
add("runs: two stray words", fixed(["runs", "all", "now"]), ("unexpected argument 'all'", "--help"))

# --- numbers: ASCII digits only, in range ----------------------------------------------------------
for flag, base in [("--port", D), ("--np", D), ("--epochs", D), ("--max-restarts", D), ("--gdc-topk", [*D, "--use-gdc"]),
                   ("--np", P), ("--rank", ["logs", "last"])]:
    for text in ["３", "٣", "۳", "½", "1.5", "0x10", "1e3", " ", "2 3"]:
        add(f"{base[0]} {flag} {text!r}", fixed([*base, flag, text]), (flag, "is not a whole number", "give a whole number"))
add("max restarts over 100", fixed([*D, "--max-restarts", "101"]), ("--max-restarts: 101 is out of range", "from 0 to 100"))
add("negative max restarts", fixed([*D, "--max-restarts", "-1"]), ("--max-restarts: -1 is out of range", "from 0 to 100"))
add("gdc-topk zero", fixed([*D, "--use-gdc", "--gdc-topk", "0"]), ("--gdc-topk: 0 is out of range", "at least 1"))
add("gdc-alpha 1", fixed([*D, "--use-gdc", "--gdc-alpha", "1"]), ("--gdc-alpha", "1"))
add("gdc-alpha text", fixed([*D, "--use-gdc", "--gdc-alpha", "much"]), ("--gdc-alpha", "much"))
add("port negative", fixed([*D, "--port", "-5"]), ("--port: -5 is out of range", "from 1 to 65535"))
add("rank huge", fixed(["logs", "last", "--rank", "99999999999999999999"]), ("no log for rank", "ranks with logs"))

# --- empty selections and empty option values ------------------------------------------------------
for flag in ["--hosts", "--exclude"]:
    for text in ["", " ", ",", ", ,"]:
        add(f"{flag} {text!r}", fixed([*D, flag, text]), (f"{flag} {text!r} names no host", f"drop {flag}"))
add("--hosts a host that is not there", fixed([*D, "--hosts", "w9"]), ("--hosts w9: no such host", "its hosts: w1, w2"),
    reads_inventory=True)
add("--exclude every worker", fixed([*D, "--exclude", "w1,w2"]), ("leaves no host to run ranks on", "keep at least one"),
    reads_inventory=True)
for flag in ["--prepare", "--launcher-args"]:
    for text in ["", "  "]:
        add(f"{flag} {text!r}", fixed([*D, flag, text]), (f"{flag} is empty", f"drop {flag}"))
add("--launcher-args with an open quote", fixed([*D, "--launcher-args", "--mca 'btl"]),
    ("--launcher-args", "No closing quotation", "quote words with spaces"))
add("setup: empty --limit", fixed(["setup", "-i", TWO, "--limit", ""]), ("--limit: is empty", "drop --limit"))
add("setup: --limit of commas", fixed(["setup", "-i", TWO, "--limit", ",,"]), ("--limit: is empty", "drop --limit"))
add("setup: empty --tags", fixed(["setup", "-i", TWO, "--tags", ""]), ("--tags: is empty", "drop --tags"))
add("setup: unknown tag", fixed(["setup", "-i", TWO, "--tags", "mpienv"]), ("'mpienv' is no tag of setup", "did you mean mpi_env"))
add("setup: one unknown among known", fixed(["setup", "-i", TWO, "--tags", "base,docker"]), ("'docker' is no tag of setup",
                                                                                             "the roles' tags"))
add("setup: --limit a host not there", fixed(["setup", "-i", TWO, "--limit", "w9"]), ("--limit w9: no such host or group",
                                                                                    "give one of them"), reads_inventory=True)
add("init: empty --dir", fixed(["init", "x", "--head", "a", "--workers", "a", "--dir", ""]), ("--dir is empty", "give the folder"))
add("init: a name too long", fixed(["init", "n" * 300, "--head", "a", "--workers", "a"]), ("too long", "give a short one"))
add("init: a name with a slash", fixed(["init", "../x", "--head", "a", "--workers", "a"]), ("'../x'", "letters, digits"))
add("init: empty --user", lambda t: ["init", "x", "--head", "a", "--workers", "a", "--user", "", "--dir", str(t)],
    ("--user ''", "a login name"))
add("init: no --head", fixed(["init", "x", "--workers", "a"]), ("--head", "--help"))
add("init: no name", fixed(["init"]), ("missing argument 'NAME'", "--help"))
add("init: empty head", lambda t: ["init", "x", "--head", "", "--workers", "a", "--dir", str(t)], ("--head ''", "NAME or NAME=ADDRESS"))
add("init: head with an empty address", lambda t: ["init", "x", "--head", "a=", "--workers", "a", "--dir", str(t)],
    ("--head 'a='", "NAME=ADDRESS"))
add("init: a worker named like an option", lambda t: ["init", "x", "--head", "a", "--workers", "-oProxy", "--dir", str(t)],
    ("--workers", "not a host name"))

# --- options that do nothing in their combination -------------------------------------------------
for flag, value in [("--gdc-alpha", "0.1"), ("--gdc-topk", "64")]:
    add(f"train {flag} without --use-gdc", fixed([*D, flag, value]), (f"{flag} only matters with --use-gdc", "add --use-gdc"))
    add(f"partition {flag} without --use-gdc", fixed([*P, flag, value]), (f"{flag} only matters with --use-gdc", "add --use-gdc"))
for flag, value in [("--epochs", "3"), ("--dataset", "cora"), ("--workload", "ddp"), ("--data-dir", "/data")]:
    add(f"{flag} with --workdir", with_workdir([flag, value]),
        (f"{flag} is an option of the reference workloads, not of --workdir", "after '--'"))
add("--use-gdc with --workdir", lambda t: [*D, "--workdir", str(t), "--use-gdc", "--", "python", "x.py"],
    ("--use-gdc is an option of the reference workloads", "after '--'"))
add("--detach with --dry-run", fixed([*D, "--detach"]), ("--detach and --dry-run", "drop one of them"))
add("--detach with --dry-run and --json", fixed([*D, "--json", "--detach"]), ("--detach and --dry-run", "drop one of them"))
add("--exclude-failed without --max-restarts", fixed([*T, "--exclude-failed"]), ("--exclude-failed only goes with --max-restarts",))
add("--detach with --max-restarts", fixed([*T, "--launcher", "ssh", "--detach", "--max-restarts", "2"]),
    ("--detach and --max-restarts: --launcher ssh restarts a run only while distrun follows it",
     "use --launcher mpirun or --launcher torchrun (it restarts a detached run on the nodes by itself)", "drop --detach"))
add("--detach with --max-restarts and --exclude-failed under torchrun",
    fixed([*T, "--launcher", "torchrun", "--detach", "--max-restarts", "1", "--exclude-failed"]),
    ("--detach --max-restarts --exclude-failed: --launcher torchrun restarts a detached run on all its nodes only",
     "use --launcher mpirun", "drop --exclude-failed", "or drop --detach"))
add("--detach with --max-restarts under Slurm", fixed([*T, "--launcher", "slurm", "--detach", "--max-restarts", "1"]),
    ("--launcher slurm restarts a run only while distrun follows it", "use --launcher mpirun or --launcher torchrun"))
add("--prepare without --workdir", fixed([*D, "--prepare", "make"]), ("--prepare runs in your project folder", "--workdir DIR"))
add("--script and --workdir", lambda t: [*D, "--workdir", str(t), "--script", write(t, "train.py", ""), "--", "python"],
    ("--script and --workdir", "give one"))
add("--workdir without a command", lambda t: [*D, "--workdir", str(t)], ("needs the command every rank runs", "after --"))
add("--workdir that does not exist", lambda t: [*D, "--workdir", str(t / "nope"), "--", "python", "x.py"],
    ("no such folder", "pass your project's folder"))
add("--slurm-mode with torchrun", fixed([*D, "--launcher", "torchrun", "--slurm-mode", "single"]),
    ("--slurm-mode goes with --launcher slurm", "this run uses torchrun"))
add("--use-gdc with --script", lambda t: [*D, "--script", write(t, "s.py", ""), "--use-gdc"],
    ("--use-gdc is an option of the reference workloads, not of --script",))
# --- containers: an image reference and a runtime that cannot work -----------------------------------
for ref in ["Ubuntu:22.04", "-v/etc:/x", "img with space", "img:tag;id", "a//b", "img@sha256:abc"]:
    add(f"--image {ref!r}", fixed([*D, "--image", ref]), (f"--image {ref!r} is not an image reference",
                                                         "[registry[:port]/]name[:tag]"))
add("--container-runtime unknown", fixed([*D, "--image", "localhost/t:1", "--container-runtime", "lxc"]),
    ("'lxc' is not one of podman, docker",))
add("--container-runtime without an image", fixed([*D, "--container-runtime", "docker"]),
    ("--container-runtime needs an image", "--image REF"), reads_inventory=True)
add("distrun_image not an image", dry_inventory("[head]\na ansible_host=192.0.2.1\n[workers]\na\n"
                                                        "[all:vars]\ndistrun_image='Bad Image'\n"),
    ("distrun_image 'Bad Image' is not an image reference", "hosts.ini"), reads_inventory=True)
add("distrun_container_runtime unknown", dry_inventory("[head]\na ansible_host=192.0.2.1\n[workers]\na\n"
                                                               "[all:vars]\ndistrun_image=localhost/t:1\n"
                                                               "distrun_container_runtime=lxc\n"),
    ("distrun_container_runtime 'lxc'", "choose one of podman, docker"), reads_inventory=True)
add("runs: --older-than alone (hours)", fixed(["runs", "--older-than", "12h"]), ("--older-than only goes with --prune",))

# --- launcher arguments that repeat what distrun sets ------------------------------------------------
for launcher, words in [("mpirun", ["-np 4", "-n 2", "--np=3", "--hostfile /tmp/h", "-H a,b", "--host a", "--prefix /opt",
                                    "--map-by node", "--output-filename /tmp/o", "-machinefile m"]),
                        ("torchrun", ["--nnodes 2", "--nnodes=2", "--nproc-per-node 8", "--nproc_per_node=8",
                                      "--node-rank 0", "--rdzv-endpoint a:1", "--rdzv-id x", "--master-port 1",
                                      "--master_addr a", "--standalone"])]:
    for text in words:
        name = text.split()[0].split("=")[0]
        add(f"{launcher} --launcher-args {text!r}", fixed([*D, "--launcher", launcher, "--launcher-args", text]),
            (f"distrun already gives {launcher} {name}", "drop it"))

for text in ["--mca orte_launch_agent /tmp/agent", "-mca orte_launch_agent x", "--mca btl_tcp_if_include eth0 --mca orte_launch_agent y"]:
    add(f"mpirun --launcher-args {text!r}", fixed([*D, "--launcher", "mpirun", "--launcher-args", text]),
        ("distrun sets mpirun's orte_launch_agent itself", "drop it"))
for text in ["--mca plm_rsh_agent 'ssh -F /tmp/c'", "-mca orte_rsh_agent rsh"]:
    add(f"mpirun --launcher-args {text!r}", fixed([*D, "--launcher", "mpirun", "--launcher-args", text]),
        (f"distrun sets mpirun's {text.split()[1]} itself", "drop it"))

# --- run ids that are no run id, every verb that takes one --------------------------------------------
for verb in ["show", "logs", "stop", "status", "attach"]:
    for text in ["", "../x", "/etc/passwd", "a b", "$(id)", "x;y", "last\n"]:
        add(f"{verb} run id {text!r}", fixed([verb, text]), ("is not a run id", "'distrun runs'"))
    add(f"{verb}: a run that does not exist", fixed([verb, "20990101-000000-train-ffff"]), ("not found", "'distrun runs' lists them"))

# --- inventories: distrun's own words ---------------------------------------------------------------
for verb in ["hostfile", "check", "setup"]:
    add(f"{verb}: an empty folder", empty_folder(verb),
        ("the folder holds no inventory file (nothing)", "hosts.yml", "distrun init"))
    add(f"{verb}: a folder with only group_vars", only_group_vars(verb),
        ("holds no inventory file (only group_vars)", "distrun init"))
    add(f"{verb}: an empty file", inventory_file(verb, ""), ("the file is empty", "list the hosts"))
    add(f"{verb}: two hosts at one address", inventory_file(verb, "[head]\na ansible_host=192.0.2.1\n[workers]\na\n"
                                                                 "b ansible_host=192.0.2.1\n"),
        ("hosts a and b have the same address 192.0.2.1", "its own ansible_host"), reads_inventory=True)
add("same address in another case", lambda t: ["hostfile", "-i", write(t, "hosts.ini",
    "[head]\na ansible_host=node1.example\n[workers]\na\nb ansible_host=NODE1.example.\n")],
    ("same address node1.example", "keep one of them"), reads_inventory=True)
add("a name and an address that collide", lambda t: ["hostfile", "-i", write(t, "hosts.ini",
    "[head]\n192.0.2.7\n[workers]\n192.0.2.7\nb ansible_host=192.0.2.7\n")],
    ("same address 192.0.2.7", "its own ansible_host"), reads_inventory=True)
add("implausible slots", lambda t: ["hostfile", "-i", write(t, "hosts.ini", "[head]\na\n[workers]\na slots=100000\n")],
    ("slots=100000", "at most 1024"), reads_inventory=True)
add("negative slots", lambda t: ["hostfile", "-i", write(t, "hosts.ini", "[head]\na\n[workers]\na slots=-2\n")],
    ("slots=-2", "slots >= 1"), reads_inventory=True)
add("INI with a stray word line", lambda t: ["hostfile", "-i", write(t, "hosts.ini", "[head\na\n[workers]\na\n")],
    ("close each header, e.g. [head]", "hosts.ini"), reads_inventory=True)
add("YAML with a tab", lambda t: ["hostfile", "-i", write(t, "h.yml", "all:\n\tchildren: {}\n")],
    ("Ansible cannot parse it", "h.yml"), reads_inventory=True)
add("YAML that is a list", lambda t: ["hostfile", "-i", write(t, "h.yml", "- a\n- b\n")],
    ("Ansible cannot parse it", "h.yml"), reads_inventory=True)

# --- the state folder -------------------------------------------------------------------------------
for words in [["runs"], ["show"], ["logs"], ["stop"], ["status"], ["attach"], ["runs", "--json"]]:
    add(f"{words[0]}: relative DISTRUN_HOME", fixed(words), ("DISTRUN_HOME='state' is a relative path", "give an absolute path"),
        env={"DISTRUN_HOME": "state"})
    add(f"{words[0]}: empty HOME", fixed(words), ("HOME is empty", "DISTRUN_HOME"), env={"DISTRUN_HOME": None, "HOME": "",
                                                                                     "XDG_STATE_HOME": None})
add("relative HOME", fixed(["runs"]), ("HOME is 'home', a relative path", "DISTRUN_HOME"),
    env={"DISTRUN_HOME": None, "HOME": "home", "XDG_STATE_HOME": None})
add("DISTRUN_HOME ./state", fixed(["show"]), ("is a relative path", "absolute"), env={"DISTRUN_HOME": "./state"})
add("DISTRUN_INVENTORY that is a folder with nothing", fixed(["hostfile"]), ("DISTRUN_INVENTORY='/nonexistent-inventory'",),
    env={"DISTRUN_INVENTORY": "/nonexistent-inventory"})
add("YAML host listed twice in a group", lambda t: ["hostfile", "-i", write(t, "h.yml",
    "all:\n  children:\n    head:\n      hosts:\n        w1: {ansible_host: 192.0.2.1}\n    workers:\n      hosts:\n"
    "        w1: {slots: 1}\n        w1: {slots: 2}\n")], ("duplicate mapping key 'w1'", "h.yml:9", "give each key once"), reads_inventory=True)
add("YAML variable given twice", lambda t: ["hostfile", "-i", write(t, "h.yml",
    "all:\n  children:\n    head:\n      hosts:\n        w1: {ansible_host: 192.0.2.1, ansible_host: 192.0.2.9}\n"
    "    workers:\n      hosts:\n        w1:\n")], ("duplicate mapping key 'ansible_host'", "h.yml", "give each key once"),
    reads_inventory=True)

# --- conda pins conda-forge cannot solve: refused before any play runs ------------------------------


def conda_inventory(words: list[str], group_vars: str, host_vars: str = "") -> Argv:
    def argv(t: Path) -> list[str]:
        write(t, "inv/group_vars/all.yml", group_vars)
        return [words[0], "-i", write(t, "inv/hosts.ini", f"[head]\na ansible_host=192.0.2.1 {host_vars}\n[workers]\na\n"),
                *words[1:]]
    return argv


UNSOLVABLE = ("mpi_env_conda_python_version=3.11 with mpi_env_conda_openmpi_version=4.0.5 cannot be solved",
              'set mpi_env_conda_openmpi_version to "4.1.6"', 'mpi_env_conda_python_version to "3.9"', "inv/hosts.ini",
              "host a")
for words in [["setup"], ["check"], ["train", "--dry-run"], ["train", "--launcher", "torchrun", "--workload", "ddp"]]:
    add(f"{' '.join(words)}: conda python 3.11 with openmpi 4.0.5", conda_inventory(words,
        'distrun_mpi_provider: conda\nmpi_env_conda_python_version: "3.11"\nmpi_env_conda_openmpi_version: "4.0.5"\n'),
        UNSOLVABLE, reads_inventory=True)
add("setup: conda openmpi 4.0.5 beside the default python", conda_inventory(["setup"],
    'distrun_mpi_provider: conda\nmpi_env_conda_openmpi_version: "4.0.5"\n'), UNSOLVABLE, reads_inventory=True)
add("train: conda python 3.12 with openmpi 4.0.x as a host var", conda_inventory(["train", "--dry-run"],
    "distrun_mpi_provider: conda\n", "mpi_env_conda_python_version=3.12 mpi_env_conda_openmpi_version=4.0.*"),
    ("mpi_env_conda_python_version=3.12 with mpi_env_conda_openmpi_version=4.0.* cannot be solved", "host a"),
    reads_inventory=True)
add("setup: conda python as a bare INI number", conda_inventory(["setup"], "distrun_mpi_provider: conda\n",
    "mpi_env_conda_python_version=3.10"),
    ("mpi_env_conda_python_version is the number 3.1", "a bare 3.10 reads as 3.1", "'\"3.10\"' in INI",
     "inv/hosts.ini"), reads_inventory=True)
