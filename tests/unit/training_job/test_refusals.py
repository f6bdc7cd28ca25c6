"""An engineer asks for a job SageMaker could not run, and is told why and what to do instead."""

from __future__ import annotations

from typing import Any

import pytest

from functions.training_job.builder import build_training_job_request
from functions.training_job.errors import JobConfigurationError, UnsupportedRegionError
from functions.training_job.refusals import gpus_per_instance, refusals

from .helpers import RUN, job_config


def refused(**changes: Any) -> JobConfigurationError:
    """Build a request from the working settings with these changes; it must be refused."""
    with pytest.raises(JobConfigurationError) as caught:
        build_training_job_request(job_config(**changes), RUN)
    return caught.value


def assert_refused(changes: dict[str, Any], *fragments: str) -> JobConfigurationError:
    error = refused(**changes)
    for fragment in fragments:
        assert fragment in str(error), f"the refusal of {changes} should say {fragment!r}; it says: {error}"
    return error


def test_the_working_settings_are_not_refused() -> None:
    assert refusals(job_config()) == [], "the baseline the refusal tests vary must be accepted"


# --- SMDDP ------------------------------------------------------------------------------------


def test_an_engineer_asks_for_smddp_on_p3_and_is_told_why_not() -> None:
    assert_refused(
        {"distribution": "smddp", "instance_type": "ml.p3.16xlarge"},
        "SMDDP runs only on ml.p4d.24xlarge and ml.p4de.24xlarge",
        "not on ml.p3.16xlarge",
        "use distribution 'torch'",
    )


def test_an_engineer_asks_for_smddp_on_p5_and_is_sent_to_torchrun() -> None:
    assert_refused(
        {"distribution": "smddp", "instance_type": "ml.p5.48xlarge"},
        "SMDDP does not support ml.p5.48xlarge",
        "use distribution 'torch', torchrun with NCCL",
    )


def test_torchrun_on_p5_is_fine() -> None:
    request = build_training_job_request(job_config(instance_type="ml.p5.48xlarge"), RUN)

    assert request["HyperParameters"]["sagemaker_torch_distributed_enabled"] == "true"


@pytest.mark.parametrize("instance_type", ["ml.p4d.24xlarge", "ml.p4de.24xlarge"])
def test_smddp_on_p4d_and_p4de_is_accepted(instance_type: str) -> None:
    request = build_training_job_request(
        job_config(distribution="smddp", instance_type=instance_type, instance_count=2, framework_version="2.3.0"),
        RUN,
    )

    assert request["AlgorithmSpecification"]["TrainingImage"].endswith(":2.3.0-gpu-py311"), "SMDDP's image"
    hyperparameters = request["HyperParameters"]
    assert hyperparameters["sagemaker_distributed_dataparallel_enabled"] == "true"
    assert hyperparameters["backend"] == '"smddp"', "the trainer must be told to use smddp"
    assert "sagemaker_torch_distributed_enabled" not in hyperparameters


def test_smddp_with_the_default_image_is_refused_and_told_which_has_it() -> None:
    assert_refused(
        {"distribution": "smddp", "instance_type": "ml.p4d.24xlarge"},
        "PyTorch 2.8.0 training image has no SMDDP",
        "set framework_version 2.3.0",
    )


def test_smddp_with_an_aws_image_that_lacks_it_is_refused() -> None:
    assert_refused(
        {
            "distribution": "smddp",
            "instance_type": "ml.p4d.24xlarge",
            "framework_version": "2.5.1",
            "py_version": "py311",
        },
        "PyTorch 2.5.1 training image has no SMDDP",
        "an image_uri that has SMDDP",
    )


def test_smddp_with_an_image_of_ones_own_is_the_engineers_call() -> None:
    config = job_config(
        distribution="smddp",
        instance_type="ml.p4d.24xlarge",
        framework_version="2.5.1",
        image_uri="658645717510.dkr.ecr.eu-west-1.amazonaws.com/smdistributed-modelparallel:2.4.1-gpu-py311-cu121",
    )

    assert refusals(config) == []


# --- Debugger with distributed training and checkpoints ---------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "instance_count", "processes"),
    [
        ("ml.g5.2xlarge", 2, "2 instance(s) x 1 GPU(s)"),
        ("ml.g5.12xlarge", 1, "1 instance(s) x 4 GPU(s)"),
    ],
)
def test_debugger_with_distributed_training_and_checkpoints_is_refused_with_a_way_out(
    instance_type: str, instance_count: int, processes: str
) -> None:
    assert_refused(
        {
            "profiling": "debugger",
            "instance_type": instance_type,
            "instance_count": instance_count,
        },
        "SageMaker Debugger refuses distributed training jobs that use SageMaker checkpointing",
        processes,
        "use profiling 'builtin', or set checkpointing: false",
    )


def test_debugger_on_a_gpu_type_of_unknown_size_is_treated_as_distributed() -> None:
    assert gpus_per_instance("ml.g7e.48xlarge") is None
    assert_refused(
        {"profiling": "debugger", "instance_type": "ml.g7e.48xlarge"},
        "whose GPU count this project does not know",
    )


def test_each_way_out_of_the_debugger_refusal_works() -> None:
    distributed: dict[str, Any] = {"profiling": "debugger", "instance_count": 2}

    without_checkpoints = build_training_job_request(job_config(**distributed, checkpointing=False), RUN)
    builtin = build_training_job_request(job_config(**{**distributed, "profiling": "builtin"}), RUN)

    assert "CheckpointConfig" not in without_checkpoints
    assert without_checkpoints["ProfilerRuleConfigurations"], "Debugger's rules must still run"
    assert "CheckpointConfig" in builtin
    assert builtin["ProfilerConfig"] == {"DisableProfiler": True}


def test_debugger_on_one_single_gpu_instance_keeps_its_checkpoints() -> None:
    request = build_training_job_request(job_config(profiling="debugger"), RUN)

    assert "CheckpointConfig" in request


def test_more_than_twenty_debugger_rules_are_refused() -> None:
    rules = [{"rule": "LowGPUUtilization", "name": f"LowGPUUtilization-{n}"} for n in range(21)]

    assert_refused(
        {"profiling": "debugger", "rules": rules},
        "21 profiler rules asked for; SageMaker takes at most 20",
    )


# --- spot -------------------------------------------------------------------------------------


def test_spot_without_max_wait_is_refused() -> None:
    assert_refused({"use_spot": True}, "managed spot training needs max_wait_seconds")


def test_spot_with_a_max_wait_shorter_than_the_runtime_is_refused() -> None:
    assert_refused(
        {"use_spot": True, "max_runtime_seconds": 7200, "max_wait_seconds": 3600},
        "max_wait_seconds (3600) must be at least max_runtime_seconds (7200)",
    )


def test_a_max_wait_without_spot_is_refused() -> None:
    assert_refused({"max_wait_seconds": 7200}, "max_wait_seconds applies to spot training only")


def test_spot_with_a_long_enough_wait_is_sent_as_such() -> None:
    request = build_training_job_request(
        job_config(use_spot=True, max_runtime_seconds=7200, max_wait_seconds=7200), RUN
    )

    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 7200,
        "MaxWaitTimeInSeconds": 7200,
    }


# --- network ----------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["subnets", "security_group_ids"])
def test_an_fsx_input_without_a_vpc_is_refused(missing: str) -> None:
    assert_refused(
        {missing: []},
        "FSx for Lustre (fs-0123456789abcdef0)",
        "set subnets and security_group_ids",
        "TCP 988 and 1018-1023",
    )


@pytest.mark.parametrize("missing", ["fsx_file_system_id", "fsx_mount_name"])
def test_an_fsx_dataset_without_its_file_system_is_refused_with_the_s3_way_out(missing: str) -> None:
    assert_refused({missing: None}, f"dataset_source fsx needs {missing}", "dataset_source: s3")


S3_DATASET = {"dataset_source": "s3", "dataset_s3_uri": "s3://retrain-data/dataset/", "fsx_file_system_id": None}


def test_an_s3_dataset_needs_its_uri() -> None:
    assert_refused({**S3_DATASET, "dataset_s3_uri": None}, "dataset_source s3 needs dataset_s3_uri")


def test_an_s3_dataset_needs_no_vpc_but_half_a_vpc_is_refused() -> None:
    assert refusals(job_config(**S3_DATASET, subnets=[], security_group_ids=[])) == []
    assert refusals(job_config(**S3_DATASET)) == [], "in the VPC as well (through its S3 endpoint)"
    assert_refused({**S3_DATASET, "security_group_ids": []}, "needs both subnets and security_group_ids")


def test_an_s3_dataset_is_a_fastfile_channel_and_a_job_without_subnets_has_no_vpc_config() -> None:
    request = build_training_job_request(job_config(**S3_DATASET, subnets=[], security_group_ids=[]), RUN)

    (train,) = [channel for channel in request["InputDataConfig"] if channel["ChannelName"] == "train"]
    assert train["InputMode"] == "FastFile"
    assert train["DataSource"] == {
        "S3DataSource": {
            "S3DataType": "S3Prefix",
            "S3Uri": "s3://retrain-data/dataset/",
            "S3DataDistributionType": "FullyReplicated",
        }
    }
    assert "VpcConfig" not in request


# --- regions ----------------------------------------------------------------------------------


def test_an_unknown_region_is_refused_for_the_training_image() -> None:
    error = assert_refused(
        {"region": "xx-nowhere-1"},
        "no AWS PyTorch training image is published in region 'xx-nowhere-1'",
        "set image_uri",
    )

    assert isinstance(error, UnsupportedRegionError), "a region problem has its own error name"


def test_a_region_without_debugger_is_refused_for_its_rule_image_only() -> None:
    # eu-central-2 has AWS's PyTorch images but no Debugger rule evaluator.
    build_training_job_request(job_config(region="eu-central-2"), RUN)

    error = assert_refused(
        {"region": "eu-central-2", "profiling": "debugger"},
        "Debugger's rule evaluator is not available in region 'eu-central-2'",
        "use profiling 'builtin'",
    )
    assert isinstance(error, UnsupportedRegionError)


def test_every_problem_is_named_at_once() -> None:
    error = refused(
        region="xx-nowhere-1",
        distribution="smddp",
        framework_version="2.3.0",
        instance_type="ml.p3.16xlarge",
        use_spot=True,
        subnets=[],
    )

    assert len(error.reasons) == 4, f"expected region, SMDDP, spot and VPC problems: {error}"
    assert not isinstance(error, UnsupportedRegionError), "more than the region is wrong"


# --- single values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"instance_count": 0}, "instance_count: Input should be greater than or equal to 1"),
        ({"max_runtime_seconds": 0}, "max_runtime_seconds: Input should be greater than or equal"),
        (
            {"max_runtime_seconds": 28 * 24 * 3600 + 1},
            "max_runtime_seconds: Input should be less than or equal to 2419200",
        ),
        ({"profiling_interval_ms": 300}, "profiling_interval_ms: Input should be 100, 200, 500"),
        ({"instance_type": "p4d.24xlarge"}, "instance_type: String should match pattern"),
        ({"region": "Europe"}, "region: String should match pattern"),
        ({"fsx_file_system_id": "fsx-1"}, "fsx_file_system_id: String should match pattern"),
        ({"distribution": "horovod"}, "distribution: Input should be 'torch' or 'smddp'"),
        ({"profiling": "smppy"}, "profiling: Input should be 'builtin' or 'debugger'"),
        ({"rules": ["Bogus"]}, "rules.0.rule: Input should be 'ProfilerReport'"),
    ],
)
def test_a_value_out_of_range_is_refused_by_name(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(JobConfigurationError) as caught:
        job_config(**changes)

    assert fragment in str(caught.value), f"expected {fragment!r} in: {caught.value}"


def test_hyperparameters_over_the_value_limit_are_refused() -> None:
    with pytest.raises(JobConfigurationError, match="at most 2500"):
        job_config(hyperparameters={"classes": "x" * 2499})  # 2501 characters once quoted


def test_too_many_hyperparameters_are_refused_counting_the_ones_we_add() -> None:
    many = {f"flag-{n}": n for n in range(92)}

    assert_refused({"hyperparameters": many}, "101 hyperparameters, SageMaker takes at most 100")


def test_hyperparameters_that_only_the_run_or_the_container_may_set_are_refused() -> None:
    with pytest.raises(JobConfigurationError) as caught:
        job_config(hyperparameters={"dataset-version": "v0", "sagemaker_program": "x.py"})

    message = str(caught.value)
    assert "'dataset-version' is set from the run" in message
    assert "'sagemaker_program' is reserved for the SageMaker container" in message


def test_trainium_is_refused_with_a_reason() -> None:
    assert_refused({"instance_type": "ml.trn1.32xlarge"}, "runs AWS Neuron")
