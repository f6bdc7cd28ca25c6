"""Combinations SageMaker refuses or that cannot work, each refused with a reason and a way out.

Single fields are checked by `JobConfig`; what is checked here needs several of them together.
Every problem is reported at once, so an engineer fixes a configuration in one pass.
"""

from __future__ import annotations

from functions.training_job.config import MAX_RULES, JobConfig
from functions.training_job.errors import JobConfigurationError, UnsupportedRegionError
from functions.training_job.images import (
    processor_for,
    rule_evaluator_image_uri,
    training_image_uri,
)

# Current SMDDP documentation: P4d and P4de only. The SDK refuses SMDDP alone on p5 ("SMDataParallel
# currently does not support p5 instances"); torchrun with NCCL runs there.
SMDDP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge")
# AWS's standard PyTorch training images with SMDDP inside, among those this project runs on (for
# 2.3.1 and later SMDDP ships only in the SMP image: name that one with image_uri).
SMDDP_FRAMEWORK_VERSIONS = ("2.3.0",)

# G5, G6 and G6e: GPUs per size.
_G_SIZES = {
    "xlarge": 1,
    "2xlarge": 1,
    "4xlarge": 1,
    "8xlarge": 1,
    "16xlarge": 1,
    "12xlarge": 4,
    "24xlarge": 4,
    "48xlarge": 8,
}
# GPUs per instance (the SDK's instance_gpu_info.json, plus the newer G6/G6e/P5e/P5en types).
GPUS_PER_INSTANCE: dict[str, int] = {
    "ml.p3.2xlarge": 1,
    "ml.p3.8xlarge": 4,
    "ml.p3.16xlarge": 8,
    "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.4xlarge": 1,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    "ml.g4dn.xlarge": 1,
    "ml.g4dn.2xlarge": 1,
    "ml.g4dn.4xlarge": 1,
    "ml.g4dn.8xlarge": 1,
    "ml.g4dn.16xlarge": 1,
    "ml.g4dn.12xlarge": 4,
    **{f"ml.{family}.{size}": gpus for family in ("g5", "g6", "g6e") for size, gpus in _G_SIZES.items()},
}


def gpus_per_instance(instance_type: str) -> int | None:
    """GPUs of one instance: 0 for CPU types, None for a GPU type this table does not know."""
    if processor_for(instance_type) == "cpu":
        return 0
    return GPUS_PER_INSTANCE.get(instance_type)


def refusals(config: JobConfig) -> list[str]:
    """Why SageMaker could not run this configuration, one reason per problem (none: it can)."""
    return [
        *_regional(config),
        *_family(config),
        *_distribution(config),
        *_debugger(config),
        *_spot(config),
        *_dataset(config),
        *_network(config),
    ]


def refuse_unworkable(config: JobConfig) -> None:
    """Raise `JobConfigurationError` naming every problem (`UnsupportedRegionError` when the region
    is the only one)."""
    regional = _regional(config)
    reasons = refusals(config)
    if reasons and reasons == regional:
        raise UnsupportedRegionError(reasons)
    if reasons:
        raise JobConfigurationError(reasons)


def _regional(config: JobConfig) -> list[str]:
    reasons: list[str] = []
    if config.image_uri is None:
        try:
            training_image_uri(
                config.region,
                config.framework_version,
                config.py_version,
                processor_for(config.instance_type),
            )
        except JobConfigurationError as error:
            reasons.extend(error.reasons)
    if config.profiling == "debugger":
        try:
            rule_evaluator_image_uri(config.region)
        except UnsupportedRegionError as error:
            reasons.extend(error.reasons)
    return reasons


def _family(config: JobConfig) -> list[str]:
    family = config.instance_type.removeprefix("ml.").split(".", 1)[0]
    if family.startswith(("trn", "inf")):
        return [
            f"{config.instance_type} runs AWS Neuron, which needs the Neuron training images and a "
            "Neuron build of the trainer: choose a GPU (ml.p*, ml.g*) or CPU instance type"
        ]
    return []


def _distribution(config: JobConfig) -> list[str]:
    if config.distribution != "smddp":
        return []
    reasons: list[str] = []
    if config.instance_type not in SMDDP_INSTANCE_TYPES:
        supported = " and ".join(SMDDP_INSTANCE_TYPES)
        if config.instance_type.startswith("ml.p5"):
            reasons.append(
                f"SMDDP does not support {config.instance_type} (it runs only on {supported}): "
                "use distribution 'torch', torchrun with NCCL, which does"
            )
        else:
            reasons.append(
                f"SMDDP runs only on {supported}, not on {config.instance_type}: choose one of "
                "those or use distribution 'torch'"
            )
    if config.image_uri is None and config.framework_version not in SMDDP_FRAMEWORK_VERSIONS:
        reasons.append(
            f"AWS's PyTorch {config.framework_version} training image has no SMDDP (it ships in "
            f"{', '.join(SMDDP_FRAMEWORK_VERSIONS)}; later versions only in the SMP image): set "
            "framework_version 2.3.0, an image_uri that has SMDDP, or distribution 'torch'"
        )
    return reasons


def _debugger(config: JobConfig) -> list[str]:
    if config.profiling != "debugger":
        return []
    reasons: list[str] = []
    gpus = gpus_per_instance(config.instance_type)
    distributed = config.instance_count > 1 or gpus is None or gpus > 1
    if distributed and config.checkpointing:
        processes = (
            f"{config.instance_count} instance(s) x {gpus} GPU(s)"
            if gpus is not None
            else f"{config.instance_type}, whose GPU count this project does not know"
        )
        reasons.append(
            "SageMaker Debugger refuses distributed training jobs that use SageMaker checkpointing "
            f"(CheckpointConfig), and this job is distributed ({processes}): use profiling "
            "'builtin', or set checkpointing: false (checkpoints then stay on the instances, and "
            "a restarted or interrupted job starts over)"
        )
    if len(config.rules) > MAX_RULES:
        reasons.append(
            f"{len(config.rules)} profiler rules asked for; SageMaker takes at most {MAX_RULES} "
            "per job (ProfilerReport alone runs every built-in rule)"
        )
    return reasons


def _spot(config: JobConfig) -> list[str]:
    if not config.use_spot:
        if config.max_wait_seconds is not None:
            return ["max_wait_seconds applies to spot training only: set use_spot: true or drop it"]
        return []
    if config.max_wait_seconds is None:
        return [
            "managed spot training needs max_wait_seconds (the runtime plus the time to wait for "
            f"spot capacity), at least max_runtime_seconds ({config.max_runtime_seconds})"
        ]
    if config.max_wait_seconds < config.max_runtime_seconds:
        return [
            f"max_wait_seconds ({config.max_wait_seconds}) must be at least max_runtime_seconds "
            f"({config.max_runtime_seconds}): it counts the runtime plus the wait for capacity"
        ]
    return []


def _dataset(config: JobConfig) -> list[str]:
    if config.dataset_source == "s3":
        if config.dataset_s3_uri is None:
            return ["dataset_source s3 needs dataset_s3_uri (s3://<data bucket>/dataset/)"]
        return []
    missing = [name for name in ("fsx_file_system_id", "fsx_mount_name") if getattr(config, name) is None]
    if missing:
        return [
            f"dataset_source fsx needs {' and '.join(missing)} (the file system linked to dataset/; "
            "or set dataset_source: s3 to read the dataset from S3 without FSx)"
        ]
    return []


def _network(config: JobConfig) -> list[str]:
    if config.subnets and config.security_group_ids:
        return []
    if config.dataset_source == "s3":
        if not config.subnets and not config.security_group_ids:
            return []  # outside a VPC the job reaches S3 through SageMaker's own network
        return ["a VPC needs both subnets and security_group_ids: one of them is empty"]
    return [
        f"the training data is on FSx for Lustre ({config.fsx_file_system_id}), which a training "
        "job reaches only from inside a VPC: set subnets and security_group_ids (the groups must "
        "allow TCP 988 and 1018-1023 to the file system)"
    ]
