"""`runs --json`, `show --json` and `train --json` read as a script would, each checked against
the published schema (docs/guide/distrun-json.schema.json): every key documented, none missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import InventoryError, UserError
from distrun.run import train as train_module
from distrun.run.diagnosis import RunSummary
from distrun.store.runs import new_run

from .conftest import REPO
from .sample_runs import SETUP, TRAIN_FAILED, TRAIN_OK, make_sample_runs

SCHEMA = json.loads((REPO / "docs" / "guide" / "distrun-json.schema.json").read_text())
TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")


def check(instance: Any, definition: str) -> None:
    jsonschema.validate(instance, {**SCHEMA, "$ref": f"#/$defs/{definition}"})


def keys(definition: str) -> set[str]:
    d = SCHEMA["$defs"][definition]
    return set(d.get("required", [])) | set(d.get("properties", {}))


def cli(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, prog_name="distrun", env={"DISTRUN_INVENTORY": None})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_runs_json_lists_every_record_with_documented_keys(private_state):
    make_sample_runs(private_state)
    code, out, err = cli(["runs", "--json"])
    assert code == 0 and err == ""
    listing = json.loads(out)
    check(listing, "runs")
    assert [r["run_id"] for r in listing["runs"]] == [SETUP, TRAIN_OK, TRAIN_FAILED]
    assert all(set(r) == keys("run") for r in listing["runs"])
    failed = listing["runs"][2]
    assert failed["status"] == "failed" and failed["rc"] == 1 and failed["duration_s"] == 42.0
    assert failed["started"].startswith("2026-11-18T") and failed["dir"].endswith(TRAIN_FAILED)


def test_runs_json_with_no_runs_is_an_empty_list(private_state):
    code, out, _ = cli(["runs", "--json"])
    assert code == 0 and json.loads(out) == {"schema": 1, "runs": []}


def test_show_json_holds_result_timings_commands_and_log_paths(private_state):
    make_sample_runs(private_state)
    code, out, _ = cli(["show", "a1b2", "--json"])
    assert code == 0
    d = json.loads(out)
    check(d, "detail")
    assert set(d) == keys("run") | keys("detail")
    assert d["run_id"] == TRAIN_OK and d["result"]["test_acc"] == 0.812
    assert d["timings"]["total_s"] == 118.68
    assert d["plan"]["world_size"] == 4 and [h["ranks"] for h in d["plan"]["hosts"]] == [2, 2]
    launch = next(iter(d["commands"]["launch"].values()))
    assert launch[0] == "/usr/bin/mpirun" and d["commands"]["partition"][1].endswith("partition.py")
    assert sorted(d["logs"]["ranks"]) == ["0", "1", "2", "3"] and all(Path(p).is_file() for p in d["logs"]["ranks"].values())
    assert Path(d["logs"]["launcher"]).is_file()


def test_show_json_of_a_bare_record_has_nulls_not_missing_keys(private_state):
    run = new_run("check", Path(TWO))
    code, out, _ = cli(["show", "--json"])  # 'last': the newest run of any verb
    d = json.loads(out)
    check(d, "detail")
    assert code == 0 and d["run_id"] == run.id and d["status"] == "running"
    assert d["result"] is None and d["plan"] is None and d["logs"]["ranks"] == {}
    assert d["commands"] == {"file": None, "partition": None, "launch": {}}


def _fake_run_job(outcome: str):
    """run_job as a real run reports: the record, progress through the listener, the end."""

    def run_job(request, listener, early=None, t0=None) -> int:
        if early is not None:  # the playbook the command line started for the run: not run here
            early.discard()
        if outcome == "inventory":
            raise InventoryError(f"inventory {request.inventory}: no host in group 'workers'; list the hosts ...")
        run = new_run("train", request.inventory)
        listener.started(run)
        listener.line('DISTRUN_EPOCH {"epoch": 1, "epochs": 1, "loss": 0.5, "train_acc": 0.9, "val_acc": 0.8, "epoch_time_s": 0.1}')
        if outcome == "preflight":
            run.finish(3, "preflight failed")
            raise UserError("preflight failed on w2: env: /opt/distrun/venv/bin/python missing; nothing was started", exit_code=3)
        listener.line('DISTRUN_RESULT {"test_acc": 0.8125}')
        run.write("result.json", json.dumps({"test_acc": 0.8125}))
        run.finish(0, "ok test_acc=0.8125")
        listener.finished(RunSummary(run.id, 0, 0, 1.0, 3, run.dir / "nodes", 3, {"test_acc": 0.8125}))
        return 0

    return run_job


@pytest.mark.parametrize("outcome,code,status", [("ok", 0, "succeeded"), ("preflight", 3, "failed"), ("inventory", 2, "refused")])
def test_train_json_is_one_object_on_stdout_and_progress_on_stderr(private_state, monkeypatch, outcome, code, status):
    monkeypatch.setattr(train_module, "run_job", _fake_run_job(outcome))
    exit_code, out, err = cli(["train", "-i", TWO, "--json"])
    obj = json.loads(out)  # the whole of stdout is one JSON object
    check(obj, "train")
    assert exit_code == code == obj["exit_code"] and obj["status"] == status
    if outcome == "ok":
        assert obj["result"] == {"test_acc": 0.8125} and obj["error"] is None
        assert set(obj) == keys("run") | keys("detail") | keys("train")
        assert "epoch 1/1" in err and "succeeded" in err  # progress went to stderr
    else:
        assert obj["error"] and err.strip().splitlines()[-1] == f"distrun: error: {obj['error']}"
    if outcome == "inventory":
        assert obj["run_id"] is None


def test_train_dry_run_json_is_the_plan(private_state, monkeypatch):
    monkeypatch.chdir(REPO)
    code, out, _ = cli(["train", "-i", TWO, "--dry-run", "--json", "--env", "TOKEN=secret-value"])
    d = json.loads(out)
    assert code == 0 and d["dry_run"] is True and d["plan"]["world_size"] == 3
    # w1 starts mpirun; w2, which mpirun reaches over ssh, starts the relay its daemon joins.
    assert set(d["launch_scripts"]) == {"w1", "w2"} and "hostfile" in d["files"]
    assert "relay" in d["launch_scripts"]["w2"] and "bin/mpirun" in d["launch_scripts"]["w1"]
    assert d["env_file_keys"] == ["TOKEN"] and "secret-value" not in out


def test_every_documented_exit_code_is_listed_in_help():
    from distrun.launchers import exit_codes
    from distrun.launchers.slurm import STATE_EXIT

    EXIT_CODES = exit_codes()

    _, out, _ = cli(["--help"])
    listed = {code for code, _ in EXIT_CODES}
    assert {code for code, _ in STATE_EXIT.values()} <= listed and {0, 1, 2, 3, 4, 5, 130} <= listed
    for code, meaning in EXIT_CODES:
        assert f"  {code} " in out and meaning.split()[0] in out
    guide = (REPO / "docs" / "guide" / "cli.md").read_text()
    for code, _ in EXIT_CODES:
        assert f"| {code} |" in guide, f"exit code {code} is not in docs/guide/cli.md"


def test_setup_limit_takes_any_group_of_the_inventory_and_refuses_a_name_it_lacks(private_state, tmp_path):
    inv = tmp_path / "hosts.ini"
    # A group that does not hold the head: its name is a valid --limit.
    inv.write_text("[head]\nw1 ansible_host=10.0.0.11\n\n[workers]\nw1\nw2 ansible_host=10.0.0.12\n\n[gpu]\nw2\n")
    code, _, err = cli(["setup", "-i", str(inv), "--limit", "gpu,w9"])
    assert code == 2
    assert "--limit w9: no such host or group" in err and "--limit gpu" not in err


def test_show_json_names_the_image_every_node_had(private_state):
    """A run with --image keeps, per node, the image id its preflight probe found: what the starter
    read from the probes' answers is what 'distrun show --json' prints."""
    from distrun.planning import containers
    from distrun.planning.containers import Container
    from distrun.run import starter as follow

    from .plans import plan_for
    from .test_preflight_needs import cluster

    plan = plan_for(cluster(), run_id="r", launcher="torchrun", workload="ddp", container=Container("localhost/train:1"))
    starter = follow.Starter(cluster(), plan)
    digest = "sha256:" + "c" * 64
    for host in ("node1", "node2"):
        answer = {"host": host, "image": {"ref": "localhost/train:1", "runtime": "podman", "user": "distrun", "id": digest}}
        starter.on_event(follow.PlaybookEvent("ok", host, "probe", data={"stdout": json.dumps(answer)}))
    starter.on_event(follow.PlaybookEvent("ok", "node3", "probe", data={"stdout": '{"host": "node3", "image": {"id": ""}}'}))
    run = new_run("train", Path(TWO))
    run.write(containers.RECORD, containers.image_record(plan, starter.images))
    code, out, _ = cli(["show", run.id, "--json"])
    d = json.loads(out)
    check(d, "detail")
    assert code == 0 and d["image"] == {"ref": "localhost/train:1", "runtime": "podman", "same": False,
                                        "nodes": {"node1": digest, "node2": digest, "node3": None}}
    plain = new_run("train", Path(TWO))
    assert json.loads(cli(["show", plain.id, "--json"])[1])["image"] is None


def test_show_names_the_image_in_one_line(private_state):
    from distrun.planning import containers
    from distrun.planning.containers import Container

    from .plans import plan_for
    from .test_preflight_needs import cluster

    plan = plan_for(cluster(), run_id="r", launcher="mpirun", workload="ddp", container=Container("localhost/train:1"))
    digest = "sha256:" + "d" * 64
    same = new_run("train", Path(TWO))
    same.write(containers.RECORD, containers.image_record(plan, dict.fromkeys(("node1", "node2", "node3"), digest)))
    assert f"image:      localhost/train:1 (podman): {digest}\n" in cli(["show", same.id])[1]
    mixed = new_run("train", Path(TWO))
    mixed.write(containers.RECORD, containers.image_record(plan, {"node1": digest}))
    assert (f"image:      localhost/train:1 (podman): node1 {digest}, node2 not probed, node3 not probed\n"
            in cli(["show", mixed.id])[1])
