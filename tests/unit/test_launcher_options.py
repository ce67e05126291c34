"""A launcher's declared options as a user meets them: `distrun train --launcher-opt KEY=VALUE`
checked against the chosen launcher's declaration (each mistake one line, exit 2, nothing
started), the value's precedence (command line, inventory, default) and origin in the dry run,
`--slurm-mode` as the older spelling of `mode=`, and `--help` written from the declarations."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from distrun.cli.main import main
from distrun.errors import UserError
from distrun.launchers import LAUNCHERS
from distrun.launchers.options import COMMAND_LINE, DEFAULT, LauncherOption, Resolved, resolve

from .conftest import REPO, distrun_bin

TWO = str(REPO / "tests" / "golden" / "inventories" / "two-nodes")
SLURM_INVENTORY = ("[all:vars]\nslurm_enabled=true\nslurm_mode=multi-job\nslurm_srun_mpi=pmi2\n"
                   "[head]\nn1 ansible_host=192.0.2.1\n[workers]\nn1\nn2 ansible_host=192.0.2.2\n")
SLURM_KEYS = "--launcher slurm takes mode, mpi, partition, time"


def _cli(argv: list[str]):
    return CliRunner().invoke(main, argv, env={"DISTRUN_INVENTORY": None, "COLUMNS": "80"}, prog_name="distrun")


def _line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


BAD = [
    ("no =", ["--launcher", "slurm", "--launcher-opt", "modesingle"],
     f"--launcher-opt 'modesingle': write it as KEY=VALUE; {SLURM_KEYS}"),
    ("no key", ["--launcher", "slurm", "--launcher-opt", "=single"],
     f"--launcher-opt '=single': write it as KEY=VALUE; {SLURM_KEYS}"),
    ("unknown key", ["--launcher", "slurm", "--launcher-opt", "mdoe=single"],
     f"--launcher-opt 'mdoe=single': --launcher slurm has no option 'mdoe' (did you mean mode?); {SLURM_KEYS}"),
    ("another launcher's key", ["--launcher", "mpirun", "--launcher-opt", "mode=single"],
     "--launcher-opt 'mode=single': --launcher mpirun has no option 'mode' (mode is an option of --launcher slurm); "
     "--launcher mpirun takes no --launcher-opt; drop it"),
    ("a launcher without options", ["--launcher", "torchrun", "--launcher-opt", "x=1"],
     "--launcher-opt 'x=1': --launcher torchrun has no option 'x'; --launcher torchrun takes no --launcher-opt; drop it"),
    ("not among the choices", ["--launcher", "slurm", "--launcher-opt", "mode=multi"],
     "--launcher-opt 'mode=multi': --launcher slurm's mode does not take 'multi'; choose one of single, multi-job; "
     "did you mean multi-job?"),
    ("breaks the inventory key's rule", ["--launcher", "slurm", "--launcher-opt", "partition=gpu;reboot"],
     "--launcher-opt 'partition=gpu;reboot': --launcher slurm's partition does not take 'gpu;reboot'; "
     "give a partition name of letters, digits and ._-"),
    ("an option-like value", ["--launcher", "slurm", "--launcher-opt", "mpi=--help"],
     "--launcher-opt 'mpi=--help': --launcher slurm's mpi does not take '--help'; give an srun --mpi type such as pmix"),
    ("an empty value", ["--launcher", "slurm", "--launcher-opt", "time="],
     "--launcher-opt 'time=': --launcher slurm's time does not take ''; give a Slurm time such as 30 or 1-00:00:00"),
    ("a key given twice", ["--launcher", "slurm", "--launcher-opt", "mode=single", "--launcher-opt", "mode=single"],
     "--launcher-opt 'mode=single': --launcher slurm's mode is given twice (mode=single before); keep one"),
    ("the alias disagrees", ["--launcher", "slurm", "--slurm-mode", "multi-job", "--launcher-opt", "mode=single"],
     "--slurm-mode multi-job and --launcher-opt mode=single disagree: --launcher slurm's mode is given twice; "
     "keep one of them"),
    ("the alias without slurm", ["--slurm-mode", "single"],
     "--slurm-mode goes with --launcher slurm (this run uses mpirun); add --launcher slurm or drop --slurm-mode"),
]


@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "real run"])
@pytest.mark.parametrize(("label", "words", "expected"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_launcher_opt_is_one_line_naming_the_fix_and_starts_nothing(private_state, label, words, expected, dry):
    result = _cli(["train", "-i", TWO, *words, *(["--dry-run"] if dry else [])])
    assert result.exit_code == 2, result.output
    assert _line(result) == f"distrun: error: train: {expected}"
    assert result.stdout == ""
    runs = private_state / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a refused run left a record"


def test_the_real_executable_refuses_with_exit_2(cli_env):
    proc = subprocess.run([distrun_bin(), "train", "-i", TWO, "--launcher", "slurm", "--launcher-opt", "queue=gpu"],
                          capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == (f"distrun: error: train: --launcher-opt 'queue=gpu': --launcher slurm has no option 'queue'; "
                           f"{SLURM_KEYS}\n")
    assert proc.stdout == ""


def _dry_json(tmp_path: Path, *words: str) -> dict:
    inventory = tmp_path / "slurm.ini"
    inventory.write_text(SLURM_INVENTORY)
    result = _cli(["train", "-i", str(inventory), "--launcher", "slurm", "--workload", "ddp", "--dry-run", "--json", *words])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_command_line_wins_over_the_inventory_which_wins_over_the_default(tmp_path):
    dry = _dry_json(tmp_path, "--launcher-opt", "mode=single", "--launcher-opt", "time=30")
    assert dry["launcher_options"] == {
        "mode": {"value": "single", "from": "the command line"},  # the inventory says multi-job
        "mpi": {"value": "pmi2", "from": "inventory slurm_srun_mpi"},
        "partition": {"value": None, "from": "the default"},
        "time": {"value": "30", "from": "the command line"},
    }
    assert dry["plan"]["launcher_options"] == {"mode": "single", "mpi": "pmi2", "time": "30"}
    assert "#SBATCH --time=30" in dry["files"]["job.sbatch"] and "srun --mpi=pmi2" in dry["files"]["job.sbatch"]
    assert not any(line.startswith("#SBATCH --partition") for line in dry["files"]["job.sbatch"].splitlines())
    inventory_only = _dry_json(tmp_path)
    assert inventory_only["launcher_options"]["mode"] == {"value": "multi-job", "from": "inventory slurm_mode"}
    assert "job-1.sbatch" in inventory_only["files"]


def test_the_dry_run_shows_each_value_and_where_it_came_from(tmp_path):
    inventory = tmp_path / "slurm.ini"
    inventory.write_text(SLURM_INVENTORY)
    result = _cli(["train", "-i", str(inventory), "--launcher", "slurm", "--dry-run", "--launcher-opt", "partition=gpu"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index("launcher options:")
    assert [" ".join(line.split()) for line in lines[at + 1:at + 5]] == [
        "mode multi-job (from inventory slurm_mode)",
        "mpi pmi2 (from inventory slurm_srun_mpi)",
        "partition gpu (from the command line)",
        "time unset: the partition's limit (from the default)",
    ]
    assert "#SBATCH --partition=gpu" in result.stdout


def test_slurm_mode_is_the_same_as_launcher_opt_mode(tmp_path):
    alias = _dry_json(tmp_path, "--slurm-mode", "single")
    generic = _dry_json(tmp_path, "--launcher-opt", "mode=single")
    both = _dry_json(tmp_path, "--slurm-mode", "single", "--launcher-opt", "mode=single")
    assert alias["plan"] == generic["plan"] == both["plan"]
    assert alias["files"] == generic["files"] and "job.sbatch" in alias["files"]
    assert alias["launcher_options"]["mode"] == {"value": "single", "from": "the command line"}


def test_a_launcher_without_options_shows_none(tmp_path):
    result = _cli(["train", "-i", TWO, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    dry = json.loads(result.stdout)
    assert dry["launcher_options"] == {} and dry["plan"]["launcher_options"] == {}
    assert "launcher options:" not in _cli(["train", "-i", TWO, "--dry-run"]).stdout


def test_a_bad_inventory_value_names_the_inventory_and_the_key():
    slurm = LAUNCHERS["slurm"]
    with pytest.raises(UserError) as exc:
        resolve(slurm, {}, {"slurm_mode": "both"}, "/inv/hosts.yml")
    assert str(exc.value) == "inventory /inv/hosts.yml: slurm_mode 'both': choose one of single, multi-job"
    assert resolve(slurm, {"mode": "single"}, {"slurm_mode": "multi-job", "slurm_partition": ""}, "x") == {
        "mode": Resolved("single", COMMAND_LINE), "mpi": Resolved("pmix", DEFAULT),
        "partition": Resolved(None, DEFAULT), "time": Resolved(None, DEFAULT)}


def _help() -> str:
    result = _cli(["train", "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


def test_help_lists_every_declared_option():
    text = _help()
    for name, launcher in LAUNCHERS.items():
        for option in launcher.options:
            assert " ".join(option.described().split()) in text, (name, option.name)
    assert "mode=single|multi-job: one multi-node job, or one single-node job per node [inventory slurm_mode; " \
           "default: single]" in text
    assert "mpirun, torchrun, ssh: none." in text


def test_an_option_added_to_a_launcher_shows_in_help_and_is_taken(monkeypatch, tmp_path):
    """Help and checks are read from the declaration: one new entry is all a new option needs."""
    declared = (LauncherOption("backend", "the rendezvous backend", choices=("c10d", "etcd"), default="c10d"),)
    monkeypatch.setattr(LAUNCHERS["torchrun"], "options", declared)
    assert "torchrun: backend=c10d|etcd: the rendezvous backend [default: c10d]" in _help()
    result = _cli(["train", "-i", TWO, "--launcher", "torchrun", "--dry-run", "--json", "--launcher-opt", "backend=etcd"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["launcher_options"] == {"backend": {"value": "etcd", "from": "the command line"}}
    refused = _cli(["train", "-i", TWO, "--launcher", "torchrun", "--dry-run", "--launcher-opt", "backend=zmq"])
    assert refused.exit_code == 2
    assert _line(refused) == ("distrun: error: train: --launcher-opt 'backend=zmq': --launcher torchrun's backend does "
                              "not take 'zmq'; choose one of c10d, etcd")
