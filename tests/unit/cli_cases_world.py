"""Invocations as the world makes them, beside cli_cases.py: inventories as admins write them
(merge keys, templates, realms, scripts that fail or hang, cycles, encodings, ports, values given
twice), text that looks like markup or emoji codes (a user's arguments come back as typed), the
environment (COLUMNS=0, a locale that is not UTF-8, an ASCII stdout, a removed working folder, a
full or closed stdout) and --json.

Three tables:
- REFUSED: refused before anything runs, one stderr line with the fragments (test_cli_args runs
  them with cli_cases.py's rows, the same way).
- ACCEPTED: valid input that must be read, with what stdout must hold (test_cli_world).
- PROCESS: through the real executable, with an environment or a stdout a CliRunner cannot
  give (test_cli_world): the exit code, and what stderr and stdout must and must not hold.
Nothing here reaches a host: addresses are TEST-NET (192.0.2.0/24), 127.0.0.1 on a closed port,
or none.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .cli_cases import TWO, Case, write

Argv = Callable[[Path], list[str]]
D = ["train", "-i", TWO, "--dry-run"]
REFUSED: list[Case] = []


def refused(label: str, argv: Argv, expect: tuple[str, ...], env: dict[str, str | None] | None = None,
            reads_inventory: bool = False, code: int = 2) -> None:
    REFUSED.append((label, argv, expect, env or {}, reads_inventory, code))


def inventory(text: str, name: str = "hosts.ini", verb: tuple[str, ...] = ("hostfile",), mode: int = 0o644,
              data: bytes | None = None) -> Argv:
    """An inventory file (``data``: its bytes as they are), read by ``verb``."""
    def argv(t: Path) -> list[str]:
        p = t / name
        if data is not None:
            p.write_bytes(data)
        else:
            p.write_text(text)
        p.chmod(mode)
        return [verb[0], "-i", str(p), *verb[1:]]
    return argv


def folder(files: dict[str, bytes | str], verb: tuple[str, ...] = ("hostfile",)) -> Argv:
    """An inventory folder: name -> text (bytes as they are)."""
    def argv(t: Path) -> list[str]:
        for name, body in files.items():
            p = t / "inv" / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(body, bytes):
                p.write_bytes(body)
            else:
                p.write_text(body)
        return [verb[0], "-i", str(t / "inv"), *verb[1:]]
    return argv


def words_of(words: list[str]) -> Argv:
    return lambda t: list(words)


HEAD = "[head]\nw1 ansible_host=192.0.2.11\n[workers]\nw1\n"
YAML_HEAD = "all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11}}\n    workers:\n      hosts: {w1: }\n"

# --- class 2: inventories, broken ones told in their own words --------------------------------------
refused("a dynamic inventory script that fails", inventory("#!/bin/sh\necho 'no CMDB token' >&2\nexit 3\n", "dyn.sh", mode=0o755),
        ("the inventory script failed", "exit code 3", "it said on stderr: no CMDB token", "--list yourself"), reads_inventory=True)
refused("a dynamic inventory script that prints no JSON", inventory("#!/bin/sh\necho 'hosts: w1'\n", "dyn.sh", mode=0o755),
        ("the inventory script failed", "JSON", "(script plugin)"), reads_inventory=True)
refused("a dynamic inventory script that hangs", inventory("#!/bin/sh\nsleep 30\n", "dyn.sh", mode=0o755),
        ("dyn.sh: its script gave no answer in 1s and was stopped", "DISTRUN_INVENTORY_TIMEOUT_S=SECONDS"),
        env={"DISTRUN_INVENTORY_TIMEOUT_S": "1"}, reads_inventory=True)
refused("a time limit that is no number", lambda t: ["hostfile", "-i", TWO],
        ("DISTRUN_INVENTORY_TIMEOUT_S='soon'", "a number above 0"), env={"DISTRUN_INVENTORY_TIMEOUT_S": "soon"},
        reads_inventory=True)
refused("a YAML group cycle", inventory("all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11}}\n"
                                        "      children: {workers: }\n    workers:\n      children: {head: }\n", "h.yml"),
        ("recursive dependency loop", "(yaml plugin)", "among its own children"), reads_inventory=True)
refused("an INI group cycle", inventory(HEAD + "[workers:children]\nhead\n[head:children]\nworkers\n"),
        ("recursive dependency loop", "(ini plugin)", "among its own children"), reads_inventory=True)
refused("an INI file with a byte-order mark", inventory("", data=b"\xef\xbb\xbf" + HEAD.encode()),
        ("hosts.ini starts with a UTF-8 byte-order mark (BOM)", "save it as UTF-8 without a BOM"), reads_inventory=True)
refused("a UTF-16 inventory", inventory("", data=HEAD.encode("utf-16")),
        ("hosts.ini is UTF-16 text", "save it as UTF-8"), reads_inventory=True)
refused("a UTF-16 YAML inventory without a BOM", inventory("", "h.yml", data=YAML_HEAD.encode("utf-16-le")),
        ("h.yml is UTF-16 text", "save it as UTF-8"), reads_inventory=True)
refused("a Latin-1 INI inventory", inventory("", data=b"[head]\nw1 ansible_host=192.0.2.11 site=M\xfcnchen\n[workers]\nw1\n"),
        ("hosts.ini: line 2 is not UTF-8", "byte 0xfc at column 34", "Latin-1", "iconv"), reads_inventory=True)
refused("a Latin-1 group_vars file", folder({"hosts.ini": HEAD, "group_vars/all.yml": b"slots: 1\nsite: M\xfcnchen\n"}),
        ("group_vars/all.yml: line 2 is not UTF-8", "Latin-1", "save it as UTF-8"), reads_inventory=True)
for port in ["abc", "0", "70000", "-1", "22x", "1e3"]:
    refused(f"ansible_port={port}", inventory(f"[head]\nw1 ansible_host=192.0.2.11 ansible_port={port}\n[workers]\nw1\n"),
            ("host w1 has ansible_port=", "from 1 to 65535"), reads_inventory=True)
refused("ansible_port as YAML text", inventory("all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11, "
                                               "ansible_port: ' 22'}}\n    workers:\n      hosts: {w1: }\n", "h.yml"),
        ("ansible_port=' 22'", "from 1 to 65535"), reads_inventory=True)
refused("check: ansible_port=abc is never 'reached'", inventory(
    "[head]\nw1 ansible_host=192.0.2.11 ansible_port=abc\n[workers]\nw1\n", verb=("check", "--json")),
        ("host w1 has ansible_port='abc'",), reads_inventory=True)
for address in [" 192.0.2.11 ", "192.0.2.11 ", " node1.example", "2001:db8::1 "]:
    refused(f"ansible_host {address!r}", inventory(
        f"all:\n  children:\n    head:\n      hosts: {{w1: {{ansible_host: '{address}'}}}}\n    workers:\n      hosts: {{w1: }}\n",
        "h.yml"), (f"ansible_host={address!r} with spaces around it", f"(ansible_host: {address.strip()})"),
            reads_inventory=True)
refused("slots given twice in two INI groups", inventory("[head]\nw1 ansible_host=192.0.2.11 slots=2\n[workers]\nw1 slots=4\n"),
        ("host w1 has slots given twice", "'2' (line 2, group head) and '4' (line 4, group workers)", "set slots once"),
        reads_inventory=True)
refused("slots given twice in two YAML groups", inventory(
    "all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11, slots: 2}}\n    workers:\n"
    "      hosts: {w1: {slots: 4}}\n", "h.yml"),
        ("host w1 has slots given twice", "'2' (line 4, group head) and '4' (line 6, group workers)"), reads_inventory=True)
refused("ansible_host given twice in two YAML groups", inventory(
    "all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11}}\n    workers:\n"
    "      hosts: {w1: {ansible_host: 192.0.2.12}}\n", "h.yml"),
        ("host w1 has ansible_host given twice", "'192.0.2.11'", "'192.0.2.12'"), reads_inventory=True)
refused("a key given twice beside a merge key", inventory(
    "all:\n  vars:\n    base: &b {slots: 1}\n  children:\n    head:\n      hosts:\n        w1: {<<: *b, ansible_host: 192.0.2.11, "
    "slots: 2, slots: 3}\n    workers:\n      hosts: {w1: }\n", "h.yml"),
        ("duplicate mapping key 'slots'", "h.yml:7", "give each key once"), reads_inventory=True)
refused("a duplicate key in group_vars", folder({"hosts.ini": HEAD, "group_vars/all.yml": "slots: 1\nslots: 2\n"}),
        ("duplicate mapping key 'slots'", "group_vars/all.yml:2:1", "give each key once"), reads_inventory=True)
refused("a templated address that needs a node's facts", inventory(
    "all:\n  children:\n    head:\n      hosts: {w1: {ansible_host: '{{ ansible_default_ipv4.address }}'}}\n"
    "    workers:\n      hosts: {w1: }\n", "h.yml"),
        ("host w1 has ansible_host='{{ ansible_default_ipv4.address }}'", "cannot render", "give the value itself"),
        reads_inventory=True)
refused("templated slots that render to no number", inventory(
    "all:\n  vars: {gpus_per_node: many}\n  children:\n    head:\n      hosts: {w1: {ansible_host: 192.0.2.11, "
    "slots: '{{ gpus_per_node }}'}}\n    workers:\n      hosts: {w1: }\n", "h.yml"),
        ("host w1 has slots='many'", "whole number"), reads_inventory=True)
refused("a login that is an ssh option", inventory("[head]\nw1 ansible_host=192.0.2.11 ansible_user=-oProxyCommand=x\n"
                                                   "[workers]\nw1\n"),
        ("ansible_user='-oProxyCommand=x'", "NAME@REALM"), reads_inventory=True)
refused("a login with two realms", inventory("[head]\nw1 ansible_host=192.0.2.11 ansible_user=a@B@C\n[workers]\nw1\n"),
        ("ansible_user='a@B@C'",), reads_inventory=True)
for flag, values in [("-i", [TWO, "local"]), ("--inventory", [TWO, TWO + "/hosts.ini"]), ("--image", ["localhost/a:1", "localhost/b:2"]),
                     ("--port", ["29500", "29501"]), ("--launcher", ["mpirun", "torchrun"]), ("--np", ["1", "2"]),
                     ("--container-runtime", ["podman", "docker"]), ("--script", ["a.py", "b.py"])]:
    long = {"-i": "--inventory"}.get(flag, flag)
    words = [w for v in values for w in (flag, v)]
    given = words if flag in ("-i", "--inventory") else ["-i", TWO, *words]
    refused(f"train {flag} twice", words_of(["train", *given, "--dry-run"]),
            (f"{long} is given twice", repr(values[0]), repr(values[1]), "give it once"))
refused("check -i twice, the second glued", lambda t: ["check", "-i", TWO, "-ilocal"],
        ("--inventory is given twice", "'local'", "give it once"))
refused("hostfile --inventory=a --inventory=b", lambda t: ["hostfile", f"--inventory={TWO}", "--inventory=local"],
        ("--inventory is given twice",))
refused("push-image --from twice", lambda t: ["push-image", "localhost/a:1", "-i", TWO, "--from", "w1", "--from", "w2"],
        ("--from is given twice", "'w1' and 'w2'"))
refused("logs --rank twice", lambda t: ["logs", "last", "--rank", "0", "--rank", "1"], ("--rank is given twice",))
refused("setup --limit twice", lambda t: ["setup", "-i", TWO, "--limit", "w1", "--limit", "w2"], ("--limit is given twice",))
refused("init --head twice", lambda t: ["init", "x", "--head", "a", "--head", "b", "--workers", "a", "--dir", str(t)],
        ("--head is given twice",))
refused("init --dir under a file", lambda t: ["init", "x", "--head", "a=192.0.2.1", "--workers", "a",
                                               "--dir", write(t, "afile", "") + "/sub"],
        ("afile/sub", "Not a directory", "a part of that path is a file"), code=7)
refused("init --dir in a read-only place", lambda t: ["init", "x", "--head", "a=192.0.2.1", "--workers", "a",
                                                       "--dir", "/proc/distrun-x"],
        ("/proc/distrun-x", "give another path"), code=7)

# --- class 3: what the user typed comes back as typed ----------------------------------------------------
for word in [":x:", ":ok:", ":cd:", "[bold]x[/bold]", "[red]", "2001:db8:a:b::1", ":a::b:", "\\[x]", "x\\"]:
    refused(f"show {word!r}", (lambda w: lambda t: ["show", w])(word), (f"{word!r} is not a run id",))
    # A colon starts a host's GPUs (--hosts a:0,1): such a word is refused as GPUs, still as typed.
    refused(f"--hosts {word!r}", (lambda w: lambda t: [*D, "--hosts", w])(word),
            (f"--hosts {word}: no such host",) if ":" not in word else (f"--hosts {word}",), reads_inventory=":" not in word)
refused("--workdir ':cd:' that does not exist", lambda t: [*D, "--workdir", str(t / ":cd:"), "--", "python", "x.py"],
        (":cd:", "no such folder"))
refused("--dataset in capitals", lambda t: [*D, "--dataset", "CORA"], ("'CORA' is not one of", "did you mean cora"))
refused("--launcher in capitals", lambda t: [*D, "--launcher", "TORCHRUN"], ("'TORCHRUN' is not one of", "did you mean torchrun"))
refused("--launcher ':x:'", lambda t: [*D, "--launcher", ":x:"], ("':x:' is not one of",))
refused("--env ':x:=1'", lambda t: [*D, "--env", ":x:=1"], ("':x:' is not a variable name",))
refused("init ':ok:'", lambda t: ["init", ":ok:", "--head", "a", "--workers", "a", "--dir", str(t)], ("':ok:'",))
refused("a host named ':x:'", inventory("[head]\n:x: ansible_host=192.0.2.11\n[workers]\n:x:\n"),
        ("':x:'", "host pattern"), reads_inventory=True)
refused("--image with an emoji code", lambda t: [*D, "--image", "localhost/:x::1"], ("'localhost/:x::1' is not an image reference",))

# --- class 4: the environment ----------------------------------------------------------------------------
refused("COLUMNS=0: a refusal still says why", lambda t: ["show", "20990101-000000-train-ffff"], ("not found",),
        env={"COLUMNS": "0"})
refused("COLUMNS=-3", lambda t: ["logs", "/etc/passwd"], ("is not a run id",), env={"COLUMNS": "-3"})
refused("LINES=0", lambda t: ["stop", "..;rm"], ("is not a run id",), env={"LINES": "0", "COLUMNS": "0"})

# --- class 5: --dry-run --json with a plan the inventory refuses (stdout: test_cli_world) -----------------
refused("--dry-run --json, more ranks than slots", lambda t: [*D, "--json", "--np", "9"], ("--np 9 is more than the 3 slots",),
        reads_inventory=True)


# ====================================================================================================
# ACCEPTED: (label, argv, env, stdout fragments). Exit 0, nothing on stderr but Ansible's warnings.
Accepted = tuple[str, Argv, dict[str, str | None], tuple[str, ...]]
ACCEPTED: list[Accepted] = []


def accepted(label: str, argv: Argv, out: tuple[str, ...], env: dict[str, str | None] | None = None) -> None:
    ACCEPTED.append((label, argv, env or {}, out))


accepted("a merge key whose value is overridden", inventory(
    "all:\n  vars:\n    base: &base {ansible_host: 192.0.2.11, slots: 1}\n  children:\n    head:\n      hosts:\n"
    "        w1:\n          <<: *base\n          slots: 2\n    workers:\n      hosts: {w1: }\n", "h.yml"), ("w1 slots=2",))
accepted("templated slots and address", inventory(
    "all:\n  vars: {gpus_per_node: 4, subnet: 192.0.2}\n  children:\n    head:\n      hosts:\n"
    "        w1: {ansible_host: '{{ subnet }}.11', slots: '{{ gpus_per_node }}'}\n    workers:\n      hosts: {w1: }\n",
    "h.yml", verb=("train", "--dry-run")), ("192.0.2.11", "ranks=4 (slots from inventory)", "world size:  4 rank(s)"))
accepted("a templated address from a group variable", inventory(
    "[head]\nw1 ansible_host=\"{{ net }}.21\"\n[workers]\nw1\nw2 ansible_host=\"{{ net }}.22\" slots=\"{{ 1 + 1 }}\"\n"
    "[all:vars]\nnet=192.0.2\n", verb=("train", "--dry-run")), ("192.0.2.21", "192.0.2.22", "w2", "ranks=2"))
accepted("a login with a realm", inventory("[head]\nw1 ansible_host=192.0.2.11 ansible_user=alice@EXAMPLE.COM\n[workers]\nw1\n"),
         ("w1 slots=1",))
accepted("a YAML file with a byte-order mark", inventory("", "h.yml", data=b"\xef\xbb\xbf" + YAML_HEAD.encode()), ("w1 slots=1",))
accepted("the same slots on two groups' lines", inventory("[head]\nw1 ansible_host=192.0.2.11 slots=2\n[workers]\nw1 slots=2\n"),
         ("w1 slots=2",))
accepted("ansible_port 2222", inventory("[head]\nw1 ansible_host=192.0.2.11 ansible_port=2222\n[workers]\nw1\n"), ("w1 slots=1",))
accepted("init --dir '~/x' (a ~ the shell left)", lambda t: ["init", "lab", "--head", "a=192.0.2.1", "--workers", "a",
                                                             "--dir", "~/inventories"],
         ("inventories/lab/hosts.yml", "next:"), env={"HOME": "HOMEDIR"})
accepted("init --user with a realm", lambda t: ["init", "lab", "--head", "a=192.0.2.1", "--workers", "a", "--dir", str(t),
                                                "--user", "admin@EXAMPLE.COM"], ("lab/hosts.yml",))
accepted("a job's text in an option value", lambda t: [*D, "--env", "MSG=:ok: [b]x[/b] 2001:db8:a:b::1"],
         ("MSG",))
accepted("an -i given once and --env twice", lambda t: [*D, "--env", "A=1", "--env", "B=2"], ("world size",))
accepted("the same value twice", lambda t: [*D, "--port", "29500", "--port", "29500"], ("world size",))


# ====================================================================================================
# PROCESS: (label, argv, env, stdout kind, exit code, stderr fragments, stdout fragments).
# stdout kind: "pipe", "closed" (the read end closed before distrun writes), "full" (/dev/full),
# "tty" (a pseudo terminal, COLUMNS as env says), "gone-cwd" (started in a folder that was removed).
Process = tuple[str, Argv, dict[str, str], str, int, tuple[str, ...], tuple[str, ...]]
PROCESS: list[Process] = []
LOCAL_FAST = "[head]\nw1 ansible_host=127.0.0.1 ansible_port=1 ansible_ssh_common_args='-o ConnectTimeout=2'\n[workers]\nw1\n"


def process(label: str, argv: Argv, out: str = "pipe", code: int = 0, err: tuple[str, ...] = (), stdout: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> None:
    PROCESS.append((label, argv, env or {}, out, code, err, stdout))


def fresh(text: str, name: str = "hosts.ini") -> Argv:
    """A file no earlier call read (so Ansible is asked, not the kept answer)."""
    def argv(t: Path) -> list[str]:
        return ["hostfile", "-i", write(t, f"{os.getpid()}-{name}", text)]
    return argv


for locale in ["C", "POSIX"]:
    process(f"LC_ALL={locale}: an inventory Ansible has not read yet", fresh(HEAD), env={"LC_ALL": locale},
            stdout=("w1 slots=1",))
    process(f"LC_ALL={locale}: a dry run", lambda t: [*D, "--np", "2"], env={"LC_ALL": locale}, stdout=("world size",))
process("LANG=C without LC_ALL", fresh(HEAD), env={"LANG": "C", "LC_ALL": ""}, stdout=("w1 slots=1",))
process("PYTHONIOENCODING=ascii: a run id with an accent", lambda t: ["show", ":x:é"], env={"PYTHONIOENCODING": "ascii"},
        code=2, err=(r"':x:\xe9' is not a run id",))
process("PYTHONIOENCODING=ascii: a dry run", lambda t: [*D, "--env", "A=é"], env={"PYTHONIOENCODING": "ascii"},
        stdout=("world size",))
process("PYTHONIOENCODING=latin-1: an inventory", lambda t: ["hostfile", "-i", TWO], env={"PYTHONIOENCODING": "latin-1"},
        stdout=("w1 slots=2",))
process("COLUMNS=0 on a terminal: the refusal", lambda t: ["show", "20990101-000000-train-ffff"], out="tty", code=2,
        env={"COLUMNS": "0"}, err=("not found",))
process("COLUMNS=0 on a terminal: runs", lambda t: ["runs"], out="tty", env={"COLUMNS": "0"}, stdout=("run",))
process("COLUMNS=abc on a terminal: a dry run", lambda t: [*D], out="tty", env={"COLUMNS": "abc"}, stdout=("world size",))
process("tab completion of a verb", lambda t: ["__complete__", ""], stdout=("plain,train", "plain,push-image"))
process("tab completion of a half verb", lambda t: ["__complete__", "pu"], stdout=("plain,push-image",))
process("tab completion of an option", lambda t: ["__complete__", "train", "--dry"], stdout=("plain,--dry-run",))
process("a removed working folder", lambda t: ["runs"], out="gone-cwd", code=7, err=("was removed", "cd to a folder that exists"))
process("a removed working folder, hostfile", lambda t: ["hostfile", "-i", TWO], out="gone-cwd", code=7, err=("was removed",))
# The harness gives these a state folder with sample runs (show, status and logs read the last one).
for words in (["--help"], ["--version"], ["runs"], ["runs", "--json"], ["hostfile", "-i", TWO], [*D], [*D, "--json"],
              ["train", "--help"], ["show", "--json"], ["show"], ["status", "--json"], ["status"], ["logs"]):
    process(f"a closed stdout: {' '.join('TWO' if w == TWO else w for w in words)}", words_of(words),
            out="closed", code=7)
process("a closed stdout: init", lambda t: ["init", "x", "--head", "a=192.0.2.1", "--workers", "a", "--dir", str(t)],
        out="closed", code=7)
process("a closed stdout: check --json", lambda t: ["check", "-i", write(t, "h.ini", LOCAL_FAST), "--json"], out="closed", code=7)
process("a closed stdout: check", lambda t: ["check", "-i", write(t, "h.ini", LOCAL_FAST)], out="closed", code=7)
process("a full stdout: runs", lambda t: ["runs"], out="full", code=7, err=("standard output: No space left on device",))
process("a full stdout: hostfile", lambda t: ["hostfile", "-i", TWO], out="full", code=7, err=("No space left on device",))
process("a full stdout: a dry run", lambda t: [*D], out="full", code=7, err=("No space left on device",))
process("--dry-run --json refused: the refusal as JSON", lambda t: [*D, "--json", "--np", "9"], code=2,
        err=("--np 9 is more than the 3 slots",), stdout=('"plan": null', '"exit_code": 2', '"error": "--np 9 is more'))
process("check --json carries schema", lambda t: ["check", "-i", write(t, "h.ini", LOCAL_FAST), "--json"], code=1,
        stdout=('"schema": 1', '"reach"'))
