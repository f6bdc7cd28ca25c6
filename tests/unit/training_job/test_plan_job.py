"""An engineer previews the training job of a run with `retrain plan-job`, offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from retrain.cli import app as retrain_app
from retrain.commands.plan_job import command

from .helpers import SETTINGS

runner = CliRunner()
app = typer.Typer()
app.command()(command)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(SETTINGS), encoding="utf-8")
    return path


def plan(*args: str) -> Any:
    return runner.invoke(app, list(args))


def test_the_request_is_printed_as_json_and_nothing_is_sent(config_file: Path) -> None:
    result = plan("--config", str(config_file), "--dataset-version", "2026-05-01")

    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert request["TrainingJobName"].startswith("retrain-2026-05-01-")
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.2xlarge"
    assert json.loads(request["HyperParameters"]["dataset-version"]) == "2026-05-01"


def test_flags_override_the_file(config_file: Path) -> None:
    # SMDDP is only in AWS's PyTorch 2.3.0 image: the file names that version (not its Python).
    config_file.write_text(yaml.safe_dump({**SETTINGS, "framework_version": "2.3.0"}), encoding="utf-8")
    result = plan(
        "--config",
        str(config_file),
        "--region",
        "us-west-2",
        "--instance-type",
        "ml.p4d.24xlarge",
        "--instance-count",
        "2",
        "--distribution",
        "smddp",
        "--profiling",
        "builtin",
    )

    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["AlgorithmSpecification"]["TrainingImage"] == (
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.3.0-gpu-py311"
    )
    assert request["HyperParameters"]["sagemaker_distributed_dataparallel_enabled"] == "true"


def test_a_refused_combination_exits_1_with_one_line_that_says_why(config_file: Path) -> None:
    result = plan("--config", str(config_file), "--instance-type", "ml.p3.16xlarge", "--distribution", "smddp")

    assert result.exit_code == 1
    assert result.stdout == "", "no request may be printed for a refused job"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("refused: SMDDP runs only on ml.p4d.24xlarge and ml.p4de.24xlarge")


def test_debugger_on_several_instances_with_checkpoints_is_refused(config_file: Path) -> None:
    result = plan("--config", str(config_file), "--instance-count", "2", "--profiling", "debugger")

    assert result.exit_code == 1
    assert "use profiling 'builtin', or set checkpointing: false" in result.stderr


def test_a_configuration_value_out_of_range_is_refused(config_file: Path) -> None:
    result = plan("--config", str(config_file), "--instance-count", "0")

    assert result.exit_code == 1
    assert "instance_count: Input should be greater than or equal to 1" in result.stderr


def test_the_environment_completes_the_file(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINING_JOB_MAX_RUNTIME_SECONDS", "3600")

    result = plan("--config", str(config_file))

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}


@pytest.mark.parametrize(
    "args",
    [
        ["--distribution", "horovod"],
        ["--profiling", "smppy"],
        ["--instance-count", "two"],
        ["--config", "/no/such/file.yaml"],
        ["--dataset-version", "has space"],
        ["--bogus"],
    ],
)
def test_usage_errors_exit_2(config_file: Path, args: list[str]) -> None:
    result = plan("--config", str(config_file), *args)

    assert result.exit_code == 2, result.output


def test_an_unreadable_configuration_file_is_a_usage_error(tmp_path: Path) -> None:
    broken = tmp_path / "job.yaml"
    broken.write_text("role_arn: [unclosed\n", encoding="utf-8")

    result = plan("--config", str(broken))

    assert result.exit_code == 2
    shown = " ".join(result.output.replace("│", " ").split())  # typer draws a box around it
    assert "is not valid YAML" in shown, result.output


def test_plan_job_is_a_retrain_command(config_file: Path) -> None:
    result = runner.invoke(retrain_app, ["plan-job", "--config", str(config_file)])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["TrainingJobName"].startswith("retrain-example-")
