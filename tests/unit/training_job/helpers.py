"""A working job configuration for the tests to vary, and the run it is built for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from functions.training_job.builder import TrainingRun
from functions.training_job.config import JobConfig, parse_job_config

EVENTS = Path(__file__).parents[2] / "events" / "sagemaker"

ACCOUNT = "123456789012"
BUCKET = f"retrain-data-{ACCOUNT}-eu-west-1"
CODE_SHA256 = "3f5a" * 16

# What a deployment gives every job: where, as whom, which data, which network.
SETTINGS: dict[str, Any] = {
    "region": "eu-west-1",
    "role_arn": f"arn:aws:iam::{ACCOUNT}:role/RetrainTraining",
    "output_s3_uri": f"s3://{BUCKET}/training/",
    "code_s3_uri": f"s3://{BUCKET}/code/sourcedir.tar.gz",
    "fsx_file_system_id": "fs-0123456789abcdef0",
    "fsx_mount_name": "abcdefgh",
    "subnets": ["subnet-0a1b2c3d4e5f60718"],
    "security_group_ids": ["sg-0a1b2c3d4e5f60718"],
    "hyperparameters": {"epochs": 100, "batch-size": 8, "crop": "1024x512", "amp": True},
}

RUN = TrainingRun(
    dataset_version="2026-05-01",
    execution=f"arn:aws:states:eu-west-1:{ACCOUNT}:execution:RetrainStateMachine:2026-05-01",
    code_sha256=CODE_SHA256,
)


def job_config(**changes: Any) -> JobConfig:
    return parse_job_config({**SETTINGS, **changes})


def load_sagemaker_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return event


def profiler_reports(*names: str) -> dict[str, dict[str, Any]]:
    """Debugger's profiler-reports/<Rule>.json files (all of them when no name is given)."""
    folder = EVENTS / "profiler-reports"
    paths = [folder / f"{name}.json" for name in names] if names else sorted(folder.glob("*.json"))
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in paths}
