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


@pytest.fixture
def aws_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An AWS config file whose default profile names a region, and no region in the environment."""
    path = tmp_path / "aws-config"
    path.write_text("[default]\nregion = ap-southeast-2\n\n[profile other]\nregion = ca-central-1\n", encoding="utf-8")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "TRAINING_JOB_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return path


def _region_of(result: Any) -> str:
    assert result.exit_code == 0, result.output
    image = json.loads(result.stdout)["AlgorithmSpecification"]["TrainingImage"]
    return str(image.split(".")[3])


@pytest.mark.usefixtures("aws_config")
def test_without_a_region_anywhere_else_the_aws_profile_s_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_region = tmp_path / "job.yaml"
    no_region.write_text(yaml.safe_dump({k: v for k, v in SETTINGS.items() if k != "region"}), encoding="utf-8")
    assert _region_of(plan("--config", str(no_region))) == "ap-southeast-2"
    monkeypatch.setenv("AWS_PROFILE", "other")
    assert _region_of(plan("--config", str(no_region))) == "ca-central-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-north-1")
    assert _region_of(plan("--config", str(no_region))) == "eu-north-1"
    monkeypatch.setenv("AWS_REGION", "us-west-1")
    assert _region_of(plan("--config", str(no_region))) == "us-west-1"
    assert _region_of(plan("--config", str(no_region), "--region", "sa-east-1")) == "sa-east-1"


@pytest.mark.usefixtures("aws_config")
def test_the_file_s_region_beats_the_aws_profile_s(config_file: Path) -> None:
    assert _region_of(plan("--config", str(config_file))) == "eu-west-1"


@pytest.mark.usefixtures("aws_config")
def test_a_missing_aws_profile_is_as_no_region(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nowhere")
    no_region = tmp_path / "job.yaml"
    no_region.write_text(yaml.safe_dump({k: v for k, v in SETTINGS.items() if k != "region"}), encoding="utf-8")
    result = plan("--config", str(no_region))
    assert result.exit_code == 1
    assert "region: required" in result.output
