"""`retrain plan-job`: print the CreateTrainingJob request a run would send, without sending it.

The same code path as the StartTraining function (`functions.training_job`): the configuration
(`--config FILE`, JSON or YAML, then `TRAINING_JOB_*` variables, then these flags), the refusals,
botocore's model. Nothing reaches AWS.

Exit codes: 0 the request (JSON) on stdout; 1 a refused combination, with the reason on one line
on stderr; 2 a usage error (unknown flag, bad value, unreadable configuration file).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from functions.training_job.builder import TrainingRun, build_training_job_request
from functions.training_job.config import load_job_config
from functions.training_job.errors import (
    JobConfigFileError,
    JobConfigurationError,
    TrainingRequestInvalidError,
)

# What a plan is built for when no dataset version is named (any valid version would do).
EXAMPLE_DATASET_VERSION = "example"


class Distribution(StrEnum):
    TORCH = "torch"
    SMDDP = "smddp"


class Profiling(StrEnum):
    BUILTIN = "builtin"
    DEBUGGER = "debugger"


def profile_region() -> str | None:
    """The region boto3 would use: AWS_DEFAULT_REGION, else the profile's in ~/.aws/config
    (AWS_CONFIG_FILE, AWS_PROFILE)."""
    import boto3  # noqa: PLC0415 (only when nothing else names a region)
    from botocore.exceptions import BotoCoreError  # noqa: PLC0415

    try:
        return boto3.session.Session().region_name
    except BotoCoreError:  # a profile that does not exist, an unreadable config: as if none
        return None


def command(
    *,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            exists=True,
            dir_okay=False,
            help="JobConfig as a JSON or YAML file.",
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(
            help="AWS region (default: the file's, TRAINING_JOB_REGION, AWS_REGION, AWS_DEFAULT_REGION, "
            "then your AWS profile's config).",
            show_default=False,
        ),
    ] = None,
    instance_type: Annotated[str | None, typer.Option(help="e.g. ml.p4d.24xlarge")] = None,
    instance_count: Annotated[int | None, typer.Option(help="Instances (hosts).")] = None,
    distribution: Annotated[Distribution | None, typer.Option(help="torch (torchrun) or smddp.")] = None,
    profiling: Annotated[Profiling | None, typer.Option(help="builtin (the trainer's) or debugger.")] = None,
    dataset_version: Annotated[
        str, typer.Option(help="The dataset version the job trains on.")
    ] = EXAMPLE_DATASET_VERSION,
) -> None:
    """Print the CreateTrainingJob request as JSON without sending it; exit 1 if it is refused."""
    overrides = {
        "region": region,
        "instance_type": instance_type,
        "instance_count": instance_count,
        "distribution": distribution.value if distribution else None,
        "profiling": profiling.value if profiling else None,
    }
    try:
        run = TrainingRun(dataset_version=dataset_version)
    except ValueError as exc:
        raise typer.BadParameter(
            f"{dataset_version!r} is not a valid dataset version (an execution name: 1-80 "
            'characters, no spaces or <>{}[]?*"#%\\^|~`$&,;:/)',
            param_hint="--dataset-version",
        ) from exc
    try:
        config = load_job_config(config_file, overrides=overrides, default_region=profile_region)
        request = build_training_job_request(config, run)
    except JobConfigFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    except (JobConfigurationError, TrainingRequestInvalidError) as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps(request, indent=2))
