"""The CreateTrainingJob request, from a `JobConfig` and a run: refused, or built and validated.

`build_training_job_request` is pure: the same configuration and run give the same request, job
name included, so a retried StartTraining state asks for the same job. `start_training_job` sends
it with an injected client and treats "that job already exists" from such a retry as success.

The request has the shape the SageMaker SDK v2's PyTorch estimator sends (a test builds the same
job with the SDK and compares them field by field), without the SDK: Lambdas stay small.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from functions.common.contracts import metric_definitions
from functions.common.debugger import PROFILER_RULE_DEFAULTS
from functions.common.models import DatasetVersion
from functions.training_job.config import JobConfig, S3Uri, encode_hyperparameter
from functions.training_job.errors import JobConfigurationError
from functions.training_job.images import (
    processor_for,
    rule_evaluator_image_uri,
    training_image_uri,
)
from functions.training_job.refusals import refuse_unworkable
from functions.training_job.validate import check_request

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient

MAX_JOB_NAME = 63
MAX_HYPERPARAMETERS = 100
MAX_TAG_VALUE = 256
TAG_DATASET_VERSION = "retrain:dataset-version"
TAG_EXECUTION = "retrain:execution"
TAG_CODE_SHA256 = "retrain:code-sha256"
TRAIN_CHANNEL = "train"
MODEL_CHANNEL = "model"
# With network isolation the container cannot fetch its code from S3 itself: SageMaker delivers
# the archive as this channel and the container unpacks it from the channel's folder (the SDK v2
# does the same, under the same name; it always says sourcedir.tar.gz, we say the archive's name).
CODE_CHANNEL = "code"
CHANNELS_IN_CONTAINER = "/opt/ml/input/data"

# Tag values allow letters, digits, spaces and _ . : / = + - @ only.
_NOT_IN_TAG = re.compile(r"[^\w\s.:/=+\-@]")
_NOT_IN_JOB_NAME = re.compile(r"[^A-Za-z0-9]+")


class TrainingRun(BaseModel):
    """What the state machine knows when it starts training (StartTraining's input)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    dataset_version: DatasetVersion
    # The execution's ARN ($$.Execution.Id) or name; part of the job name, so a new execution for
    # the same dataset version gets a job of its own, and a retry within one execution does not.
    execution: str | None = Field(default=None, min_length=1, max_length=256)
    # sha256 of the released sourcedir.tar.gz (checked before the job is created), for the job's tags.
    code_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    # sourcedir.tar.gz for this run; the configuration's code_s3_uri when absent.
    code_s3_uri: S3Uri | None = None


class StartedTrainingJob(BaseModel):
    """StartTraining's output: the job to wait for."""

    job_name: str
    job_arn: str
    # True when a retry found the job its first attempt had created.
    already_existed: bool = False


def training_job_name(config: JobConfig, run: TrainingRun) -> str:
    """`<prefix>-<dataset version>-<8 hex>`, at most 63 characters of [A-Za-z0-9-].

    The hash covers the execution, the code and the whole configuration: the same run and
    configuration always give the same name (a retry finds its job), anything else a new one.
    """
    fingerprint = json.dumps(
        {
            "dataset_version": run.dataset_version,
            "execution": run.execution,
            "code_sha256": run.code_sha256,
            "code_s3_uri": run.code_s3_uri,
            "config": config.model_dump(mode="json"),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:8]
    room = MAX_JOB_NAME - len(config.job_name_prefix) - len(digest) - 2
    version = _NOT_IN_JOB_NAME.sub("-", run.dataset_version)[:room].strip("-")
    return "-".join(part for part in (config.job_name_prefix, version, digest) if part)


def training_image(config: JobConfig) -> str:
    if config.image_uri is not None:
        return config.image_uri
    return training_image_uri(
        config.region,
        config.framework_version,
        config.py_version,
        processor_for(config.instance_type),
    )


def build_training_job_request(config: JobConfig, run: TrainingRun) -> dict[str, Any]:
    """The CreateTrainingJob request for this run, refused (`JobConfigurationError`) when it cannot
    work and validated against botocore's model (`TrainingRequestInvalidError`) before it is
    returned."""
    refuse_unworkable(config)
    code_uri = run.code_s3_uri or config.code_s3_uri
    if code_uri is None:
        raise JobConfigurationError(
            "no trainer code: set code_s3_uri (the s3:// URI of sourcedir.tar.gz) in the configuration or the run"
        )
    job_name = training_job_name(config, run)
    image = training_image(config)

    request: dict[str, Any] = {
        "TrainingJobName": job_name,
        "RoleArn": config.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": image,
            # FSx for Lustre inputs are mounted: File mode (an S3 dataset channel says FastFile).
            "TrainingInputMode": "File",
            "MetricDefinitions": metric_definitions(),
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "HyperParameters": _hyperparameters(
            config, run, job_name, _code_in_container(code_uri) if config.network_isolation else code_uri
        ),
        "InputDataConfig": _channels(config, code_uri),
        "OutputDataConfig": _kms({"S3OutputPath": config.output_s3_uri}, config.output_kms_key_id),
        "ResourceConfig": _kms(
            {
                "InstanceType": config.instance_type,
                "InstanceCount": config.instance_count,
                "VolumeSizeInGB": config.volume_size_gb,
            },
            config.volume_kms_key_id,
            key="VolumeKmsKeyId",
        ),
        "StoppingCondition": _stopping_condition(config),
        "Environment": {
            # torchrun gives its workers 30 s after a SIGTERM (a stop, a spot reclaim) before it
            # kills them; SageMaker allows 120 s: the trainer's checkpoint-and-exit gets 100.
            # Kept in step with trainer/stopping.py's SHUTDOWN_TIMEOUT_SECONDS (a test checks).
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "100",
            **config.environment,
            # The trainer records the image in metrics.json's lineage.
            "TRAINING_IMAGE_URI": image,
            # What the trainer's built-in profiler does (nothing more when Debugger profiles).
            "RETRAIN_PROFILING": config.profiling,
            "RETRAIN_PROFILING_INTERVAL_MS": str(config.profiling_interval_ms),
        },
        "Tags": _tags(config, run),
    }
    # FSx is reached only from the VPC; an S3 dataset may be read without one.
    if config.subnets:
        request["VpcConfig"] = {"Subnets": config.subnets, "SecurityGroupIds": config.security_group_ids}
    # Sent only when on, as the SDK does (off is the API's default).
    if config.network_isolation:
        request["EnableNetworkIsolation"] = True
    if config.encrypt_inter_container_traffic:
        request["EnableInterContainerTrafficEncryption"] = True
    if config.use_spot:
        request["EnableManagedSpotTraining"] = True
    if config.checkpointing:
        # Per job: a spot restart of this job resumes from it, another job never does.
        request["CheckpointConfig"] = {"S3Uri": f"{config.checkpoint_base_uri}/{job_name}"}
    request.update(_profiling(config))
    check_request(request)
    return request


def start_training_job(request: dict[str, Any], *, sagemaker: SageMakerClient) -> StartedTrainingJob:
    """Send the request; a retry that finds its own job (same name and hyperparameters) succeeds."""
    name = request["TrainingJobName"]
    try:
        created = sagemaker.create_training_job(**request)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceInUse":
            raise
        existing = sagemaker.describe_training_job(TrainingJobName=name)
        # Same name and same hyperparameters: the job an earlier attempt of this state created.
        if existing.get("HyperParameters") != request.get("HyperParameters"):
            raise
        return StartedTrainingJob(job_name=name, job_arn=existing["TrainingJobArn"], already_existed=True)
    return StartedTrainingJob(job_name=name, job_arn=created["TrainingJobArn"])


def _hyperparameters(config: JobConfig, run: TrainingRun, job_name: str, code_uri: str) -> dict[str, str]:
    """Trainer flags, then the `sagemaker_*` parameters the PyTorch container reads, all
    JSON-encoded as the SDK v2 sends them."""
    values: dict[str, str | int | float | bool] = {
        **config.hyperparameters,
        "dataset-version": run.dataset_version,
        "backend": config.distribution,
        "sagemaker_program": config.entry_point,
        "sagemaker_submit_directory": code_uri,
        "sagemaker_container_log_level": config.container_log_level,
        "sagemaker_job_name": job_name,
        "sagemaker_region": config.region,
    }
    if config.distribution == "torch":
        # torchrun on every host, one process per GPU (the container launches it).
        values["sagemaker_torch_distributed_enabled"] = True
    else:
        values["sagemaker_distributed_dataparallel_enabled"] = True
        values["sagemaker_distributed_dataparallel_custom_mpi_options"] = ""
    values["sagemaker_instance_type"] = config.instance_type
    if len(values) > MAX_HYPERPARAMETERS:
        raise JobConfigurationError(
            f"{len(values)} hyperparameters, SageMaker takes at most {MAX_HYPERPARAMETERS} "
            f"({len(values) - len(config.hyperparameters)} of them are set by this project): "
            "drop some from the configuration"
        )
    return {name: encode_hyperparameter(value) for name, value in values.items()}


def _train_channel(config: JobConfig) -> dict[str, Any]:
    if config.dataset_source == "s3":
        # FastFile: the prefix appears as files under the channel's folder and each file is read
        # from S3 when opened: the trainer reads only what the frozen manifest names, and the job
        # starts without downloading the whole curated zone first.
        return {
            "ChannelName": TRAIN_CHANNEL,
            "InputMode": "FastFile",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": config.dataset_s3_uri,
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
        }
    return {
        "ChannelName": TRAIN_CHANNEL,
        "DataSource": {
            "FileSystemDataSource": {
                "FileSystemId": config.fsx_file_system_id,
                "FileSystemType": "FSxLustre",
                "DirectoryPath": f"/{config.fsx_mount_name}/{config.fsx_directory}",
                # The trainer only reads; ro keeps a bug from touching the curated zone.
                "FileSystemAccessMode": "ro",
            }
        },
    }


def _channels(config: JobConfig, code_uri: str) -> list[dict[str, Any]]:
    channels: list[dict[str, Any]] = [_train_channel(config)]
    if config.model_s3_uri is not None:
        channels.append(_s3_channel(MODEL_CHANNEL, config.model_s3_uri))
    if config.network_isolation:
        # Last, as the SDK appends it.
        channels.append(_s3_channel(CODE_CHANNEL, code_uri))
    return channels


def _code_in_container(code_uri: str) -> str:
    """Where the `code` channel puts the archive: a prefix channel on one object keeps its name."""
    return f"{CHANNELS_IN_CONTAINER}/{CODE_CHANNEL}/{code_uri.rsplit('/', 1)[-1]}"


def _s3_channel(name: str, uri: str) -> dict[str, Any]:
    return {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}
        },
    }


def _stopping_condition(config: JobConfig) -> dict[str, int]:
    condition = {"MaxRuntimeInSeconds": config.max_runtime_seconds}
    if config.use_spot and config.max_wait_seconds is not None:
        condition["MaxWaitTimeInSeconds"] = config.max_wait_seconds
    return condition


def _profiling(config: JobConfig) -> dict[str, Any]:
    if config.profiling == "builtin":
        # Said explicitly, as the SDK does: no Debugger system monitoring beside our own sampler.
        return {"ProfilerConfig": {"DisableProfiler": True}}
    image = rule_evaluator_image_uri(config.region)
    return {
        "ProfilerConfig": {
            "S3OutputPath": config.output_s3_uri,
            "ProfilingIntervalInMilliseconds": config.profiling_interval_ms,
            "DisableProfiler": False,
        },
        "ProfilerRuleConfigurations": [
            {
                "RuleConfigurationName": spec.configuration_name,
                "RuleEvaluatorImage": image,
                "RuleParameters": {
                    **PROFILER_RULE_DEFAULTS[spec.rule],
                    **{name: str(value) for name, value in spec.parameters.items()},
                    "rule_to_invoke": spec.rule,
                },
            }
            for spec in config.rules
        ],
    }


def _tags(config: JobConfig, run: TrainingRun) -> list[dict[str, str]]:
    tags = dict(config.tags)
    tags[TAG_DATASET_VERSION] = run.dataset_version
    if run.execution is not None:
        tags[TAG_EXECUTION] = run.execution
    if run.code_sha256 is not None:
        tags[TAG_CODE_SHA256] = run.code_sha256
    # A dataset version may hold characters a tag value may not (`!`, `(`): replaced, not refused.
    return [{"Key": key, "Value": _NOT_IN_TAG.sub("_", value)[:MAX_TAG_VALUE]} for key, value in tags.items()]


def _kms(section: dict[str, Any], key_id: str | None, *, key: str = "KmsKeyId") -> dict[str, Any]:
    return {**section, key: key_id} if key_id else section
