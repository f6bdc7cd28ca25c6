"""The state machine starts training for a dataset version, and the request says exactly what to
run: which image and code, on what, with which data, where results and checkpoints go."""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from functions.common.contracts import metric_definitions
from functions.training_job.builder import (
    TAG_CODE_SHA256,
    TAG_DATASET_VERSION,
    TAG_EXECUTION,
    TrainingRun,
    build_training_job_request,
    start_training_job,
    training_job_name,
)
from functions.training_job.errors import JobConfigurationError
from functions.training_job.validate import request_problems
from trainer import stopping

from .helpers import BUCKET, CODE_SHA256, RUN, job_config

JOB_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
IMAGE = "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"


def decoded(hyperparameters: dict[str, str]) -> dict[str, Any]:
    """What the PyTorch container hands the script: each value JSON-decoded."""
    return {name: json.loads(value) for name, value in hyperparameters.items()}


def test_a_default_run_trains_on_one_gpu_instance_with_torchrun_and_the_builtin_profiler() -> None:
    request = build_training_job_request(job_config(), RUN)

    assert request["AlgorithmSpecification"] == {
        "TrainingImage": IMAGE,
        "TrainingInputMode": "File",
        "MetricDefinitions": metric_definitions(),
        "EnableSageMakerMetricsTimeSeries": True,
    }
    assert request["ResourceConfig"] == {
        "InstanceType": "ml.g5.2xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 50,
    }
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}
    assert request["ProfilerConfig"] == {"DisableProfiler": True}
    assert "ProfilerRuleConfigurations" not in request
    assert request["EnableInterContainerTrafficEncryption"] is True
    assert "EnableManagedSpotTraining" not in request, "spot is off unless asked for"
    assert request_problems(request) == []


def test_the_container_gets_the_sagemaker_parameters_the_sdk_would_send() -> None:
    request = build_training_job_request(job_config(), RUN)
    name = request["TrainingJobName"]

    assert request["HyperParameters"] == {
        "epochs": "100",
        "batch-size": "8",
        "crop": '"1024x512"',
        "amp": "true",
        "dataset-version": '"2026-05-01"',
        "backend": '"torch"',
        "sagemaker_program": '"train.py"',
        # Isolated, the container finds its code in the `code` channel, not in S3.
        "sagemaker_submit_directory": '"/opt/ml/input/data/code/sourcedir.tar.gz"',
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": f'"{name}"',
        "sagemaker_region": '"eu-west-1"',
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_instance_type": '"ml.g5.2xlarge"',
    }


def test_smddp_gets_its_launcher_flags_instead_of_torchrun() -> None:
    config = job_config(distribution="smddp", instance_type="ml.p4d.24xlarge", framework_version="2.3.0")

    hyperparameters = decoded(build_training_job_request(config, RUN)["HyperParameters"])

    assert hyperparameters["sagemaker_distributed_dataparallel_enabled"] is True
    assert hyperparameters["sagemaker_distributed_dataparallel_custom_mpi_options"] == ""
    assert hyperparameters["sagemaker_instance_type"] == "ml.p4d.24xlarge"
    assert "sagemaker_torch_distributed_enabled" not in hyperparameters


def test_the_trainer_accepts_every_flag_the_job_passes_it() -> None:
    """What the container runs: `train.py --name value` for each non-sagemaker hyperparameter."""
    trainer = pytest.importorskip("trainer.train")
    hyperparameters = decoded(
        build_training_job_request(
            job_config(distribution="smddp", instance_type="ml.p4d.24xlarge", framework_version="2.3.0"), RUN
        )["HyperParameters"]
    )
    argv = [
        part
        for name, value in hyperparameters.items()
        if not name.startswith("sagemaker_")
        for part in (f"--{name}", str(value))
    ]

    args = trainer.get_args_parser().parse_args(argv)

    assert args.dataset_version == "2026-05-01"
    assert args.backend == "smddp"
    assert (args.epochs, args.batch_size, args.crop, args.amp) == (100, 8, "1024x512", True)


def test_the_data_comes_from_fsx_through_the_vpc() -> None:
    request = build_training_job_request(job_config(), RUN)

    assert request["InputDataConfig"][0] == {
        "ChannelName": "train",
        "DataSource": {
            "FileSystemDataSource": {
                "FileSystemId": "fs-0123456789abcdef0",
                "FileSystemType": "FSxLustre",
                "DirectoryPath": "/abcdefgh/dataset",
                "FileSystemAccessMode": "ro",
            }
        },
    }
    assert request["VpcConfig"] == {
        "Subnets": ["subnet-0a1b2c3d4e5f60718"],
        "SecurityGroupIds": ["sg-0a1b2c3d4e5f60718"],
    }


def test_the_accepted_model_arrives_as_the_model_channel() -> None:
    uri = f"s3://{BUCKET}/models/accepted/"

    channels = build_training_job_request(job_config(model_s3_uri=uri), RUN)["InputDataConfig"]

    assert channels[1] == {
        "ChannelName": "model",
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": uri,
                "S3DataDistributionType": "FullyReplicated",
            }
        },
    }


def test_outputs_checkpoints_and_keys_go_where_configured() -> None:
    key = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    config = job_config(
        output_kms_key_id=key,
        volume_kms_key_id=key,
        checkpoint_s3_uri=f"s3://{BUCKET}/ckpt/",
    )

    request = build_training_job_request(config, RUN)

    assert request["OutputDataConfig"] == {
        "S3OutputPath": f"s3://{BUCKET}/training/",
        "KmsKeyId": key,
    }
    assert request["ResourceConfig"]["VolumeKmsKeyId"] == key
    assert request["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/ckpt/{request['TrainingJobName']}"}


def test_checkpoints_default_to_a_folder_per_job_beside_the_output() -> None:
    request = build_training_job_request(job_config(), RUN)

    assert request["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/training/checkpoints/{request['TrainingJobName']}"}


def test_the_trainer_learns_its_image_and_profiling_from_the_environment() -> None:
    config = job_config(environment={"NCCL_DEBUG": "WARN"}, profiling_interval_ms=1000)

    environment = build_training_job_request(config, RUN)["Environment"]

    assert environment == {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(stopping.SHUTDOWN_TIMEOUT_SECONDS),
        "NCCL_DEBUG": "WARN",
        "TRAINING_IMAGE_URI": IMAGE,
        "RETRAIN_PROFILING": "builtin",
        "RETRAIN_PROFILING_INTERVAL_MS": "1000",
    }


def test_torchrun_waits_for_the_checkpoint_after_a_sigterm_within_sagemakers_grace() -> None:
    # SageMaker kills the container 120 s after its SIGTERM; torchrun's default is 30 s.
    environment = build_training_job_request(job_config(), RUN)["Environment"]

    assert 30 < int(environment["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < 120


def test_the_job_is_tagged_with_its_dataset_version_execution_and_code() -> None:
    tags = build_training_job_request(job_config(tags={"team": "perception"}), RUN)["Tags"]

    assert {tag["Key"]: tag["Value"] for tag in tags} == {
        "team": "perception",
        TAG_DATASET_VERSION: "2026-05-01",
        TAG_EXECUTION: RUN.execution,
        TAG_CODE_SHA256: CODE_SHA256,
    }


def test_a_dataset_version_with_characters_tags_refuse_is_tagged_legibly() -> None:
    run = TrainingRun(dataset_version="drop(7)!")

    request = build_training_job_request(job_config(), run)

    tags = {tag["Key"]: tag["Value"] for tag in request["Tags"]}
    assert tags[TAG_DATASET_VERSION] == "drop_7__"
    assert request_problems(request) == []


def test_debugger_profiling_asks_for_the_rules_with_the_regions_evaluator() -> None:
    config = job_config(
        profiling="debugger",
        profiling_interval_ms=100,
        rules=[
            "ProfilerReport",
            {"rule": "LowGPUUtilization", "parameters": {"threshold_p95": 60}},
            {"rule": "LowGPUUtilization", "name": "LowGPUUtilization-strict"},
        ],
    )

    request = build_training_job_request(config, RUN)

    assert request["ProfilerConfig"] == {
        "S3OutputPath": f"s3://{BUCKET}/training/",
        "ProfilingIntervalInMilliseconds": 100,
        "DisableProfiler": False,
    }
    rules = request["ProfilerRuleConfigurations"]
    image = "929884845733.dkr.ecr.eu-west-1.amazonaws.com/sagemaker-debugger-rules:latest"
    assert {rule["RuleEvaluatorImage"] for rule in rules} == {image}
    assert [rule["RuleConfigurationName"] for rule in rules] == [
        "ProfilerReport",
        "LowGPUUtilization",
        "LowGPUUtilization-strict",
    ]
    assert rules[0]["RuleParameters"] == {"rule_to_invoke": "ProfilerReport"}
    assert rules[1]["RuleParameters"]["threshold_p95"] == "60"
    assert rules[2]["RuleParameters"]["threshold_p95"] == "70"
    assert rules[2]["RuleParameters"]["rule_to_invoke"] == "LowGPUUtilization"


def test_a_profiler_report_override_names_the_rule_it_changes() -> None:
    config = job_config(
        profiling="debugger",
        rules=[{"rule": "ProfilerReport", "parameters": {"CPUBottleneck_threshold": 20}}],
    )

    rules = build_training_job_request(config, RUN)["ProfilerRuleConfigurations"]

    assert rules[0]["RuleParameters"] == {
        "CPUBottleneck_threshold": "20",
        "rule_to_invoke": "ProfilerReport",
    }


def test_an_unknown_rule_parameter_is_refused_before_aws_sees_it() -> None:
    with pytest.raises(JobConfigurationError, match="LowGPUUtilization has no parameter treshold"):
        job_config(rules=[{"rule": "LowGPUUtilization", "parameters": {"treshold": 1}}])


def test_a_run_without_trainer_code_is_refused() -> None:
    with pytest.raises(JobConfigurationError, match="no trainer code: set code_s3_uri"):
        build_training_job_request(job_config(code_s3_uri=None), RUN)


def test_the_run_may_name_its_own_code() -> None:
    run = RUN.model_copy(update={"code_s3_uri": f"s3://{BUCKET}/code/abc/sourcedir.tar.gz"})

    request = build_training_job_request(job_config(), run)

    assert request["InputDataConfig"][-1]["DataSource"]["S3DataSource"]["S3Uri"] == (
        f"s3://{BUCKET}/code/abc/sourcedir.tar.gz"
    )


def test_the_training_code_reaches_no_network_and_gets_its_code_from_sagemaker() -> None:
    request = build_training_job_request(job_config(), RUN)

    assert request["EnableNetworkIsolation"] is True
    assert request["InputDataConfig"][-1] == {
        "ChannelName": "code",
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": f"s3://{BUCKET}/code/sourcedir.tar.gz",
                "S3DataDistributionType": "FullyReplicated",
            }
        },
    }
    assert json.loads(request["HyperParameters"]["sagemaker_submit_directory"]) == (
        "/opt/ml/input/data/code/sourcedir.tar.gz"
    ), "an isolated container cannot download its code from S3 itself"


def test_without_isolation_the_container_downloads_its_code_itself() -> None:
    request = build_training_job_request(job_config(network_isolation=False), RUN)

    assert "EnableNetworkIsolation" not in request
    assert [channel["ChannelName"] for channel in request["InputDataConfig"]] == ["train"]
    assert json.loads(request["HyperParameters"]["sagemaker_submit_directory"]) == (
        f"s3://{BUCKET}/code/sourcedir.tar.gz"
    )


# --- job names --------------------------------------------------------------------------------


def test_a_retry_asks_for_the_same_job() -> None:
    first = build_training_job_request(job_config(), RUN)
    retry = build_training_job_request(job_config(), RUN)

    assert first == retry


def test_a_new_execution_or_a_new_configuration_gets_a_new_job() -> None:
    name = training_job_name(job_config(), RUN)
    other_execution = RUN.model_copy(update={"execution": f"{RUN.execution}-rerun"})

    assert training_job_name(job_config(), other_execution) != name
    assert training_job_name(job_config(instance_count=2), RUN) != name
    assert name.startswith("retrain-2026-05-01-"), name


@pytest.mark.parametrize(
    "version",
    ["2026-05-01", "v" * 80, "drop_7.final", "..--__", "Straße-ü", "x"],
)
def test_job_names_fit_sagemakers_rules_whatever_the_dataset_version(version: str) -> None:
    name = training_job_name(job_config(), TrainingRun(dataset_version=version))

    assert len(name) <= 63, f"{name!r} is {len(name)} characters"
    assert JOB_NAME.fullmatch(name), f"{name!r} is not a valid training job name"


def test_a_custom_prefix_starts_the_name() -> None:
    name = training_job_name(job_config(job_name_prefix="seg-nightly"), RUN)

    assert name.startswith("seg-nightly-2026-05-01-")


# --- sending ----------------------------------------------------------------------------------


@pytest.fixture
def sagemaker() -> Any:
    return boto3.client("sagemaker", region_name="eu-west-1")


def test_starting_a_job_sends_the_request_once(sagemaker: Any) -> None:
    request = build_training_job_request(job_config(), RUN)
    arn = f"arn:aws:sagemaker:eu-west-1:123456789012:training-job/{request['TrainingJobName']}"
    with Stubber(sagemaker) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": arn}, request)

        started = start_training_job(request, sagemaker=sagemaker)

    assert started.job_arn == arn
    assert not started.already_existed


def test_a_retry_after_the_job_was_created_finds_it(sagemaker: Any) -> None:
    request = build_training_job_request(job_config(), RUN)
    name = request["TrainingJobName"]
    arn = f"arn:aws:sagemaker:eu-west-1:123456789012:training-job/{name}"
    described = {
        "TrainingJobName": name,
        "TrainingJobArn": arn,
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Starting",
        "AlgorithmSpecification": request["AlgorithmSpecification"],
        "ResourceConfig": request["ResourceConfig"],
        "StoppingCondition": request["StoppingCondition"],
        "CreationTime": "2026-05-01T12:00:03Z",
        "HyperParameters": request["HyperParameters"],
    }
    with Stubber(sagemaker) as stub:
        stub.add_client_error(
            "create_training_job",
            service_error_code="ResourceInUse",
            service_message="Training job names must be unique within an AWS account and region",
        )
        stub.add_response("describe_training_job", described, {"TrainingJobName": name})

        started = start_training_job(request, sagemaker=sagemaker)

    assert started.already_existed
    assert started.job_arn == arn


def test_a_name_taken_by_another_job_is_not_mistaken_for_ours(sagemaker: Any) -> None:
    request = build_training_job_request(job_config(), RUN)
    name = request["TrainingJobName"]
    described = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:eu-west-1:123456789012:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed",
        "AlgorithmSpecification": request["AlgorithmSpecification"],
        "ResourceConfig": request["ResourceConfig"],
        "StoppingCondition": request["StoppingCondition"],
        "CreationTime": "2026-02-01T12:00:03Z",
        "HyperParameters": {**request["HyperParameters"], "epochs": "1"},
    }
    with Stubber(sagemaker) as stub:
        stub.add_client_error("create_training_job", service_error_code="ResourceInUse")
        stub.add_response("describe_training_job", described, {"TrainingJobName": name})

        with pytest.raises(ClientError, match="ResourceInUse"):
            start_training_job(request, sagemaker=sagemaker)
