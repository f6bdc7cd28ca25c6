"""An engineer who knows the SageMaker SDK v2 builds the same job with its PyTorch estimator, and
our request matches the SDK's field by field; every difference left is listed here with its reason.

Nothing is sent: the SDK's session has a fake SageMaker client that records the request, an
explicit bucket, role, region and code location (so it never looks anything up or uploads), and
its telemetry call is replaced.

Differences that are gone because the builder follows the SDK: every hyperparameter value
JSON-encoded; the `sagemaker_*` set (program, submit directory, log level "20", job name, region,
the launcher flag, instance type, SMDDP's empty MPI options as '""'); EnableManagedSpotTraining and
EnableInterContainerTrafficEncryption sent only when on; `ProfilerConfig: {DisableProfiler: true}`
with the built-in profiler; Debugger rules named after themselves with the SDK's parameters
(StepOutlier's `mode` as the string "None"). The SDK is given what our builder adds on its own
(tags, environment, `dataset-version` and `backend` flags, metric definitions) and
`debugger_hook_config=False`: left to itself it adds a DebugHookConfig, whose smdebug hook we do
not use (framework profiling is deprecated since PyTorch 2.0).

Known differences in what is refused, not in requests: see the SMDDP tests at the end.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import boto3
import pytest

from functions.common.contracts import metric_definitions
from functions.common.debugger import PROFILER_RULE_DEFAULTS
from functions.training_job.builder import (
    TRAIN_CHANNEL,
    TrainingRun,
    build_training_job_request,
    training_image,
    training_job_name,
)
from functions.training_job.config import JobConfig
from functions.training_job.errors import JobConfigurationError

from .helpers import BUCKET, RUN, job_config

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
# The SDK lives in its own environment (it pins attrs, packaging, protobuf and more): these tests
# run there, with `make test-sdk-parity` (which `make test` runs), and skip in .venv.
sagemaker_pytorch = pytest.importorskip("sagemaker.pytorch", reason="the SageMaker SDK v2: make test-sdk-parity")
from sagemaker.debugger import ProfilerConfig, ProfilerRule, rule_configs  # noqa: E402
from sagemaker.inputs import FileSystemInput, TrainingInput  # noqa: E402
from sagemaker.session import Session  # noqa: E402
from sagemaker.telemetry import telemetry_logging  # noqa: E402

# Per case, path -> why our request differs from the SDK's there. A path listed must differ (so
# the list never outlives its reason); any other difference fails the test.
EXPLAINED_BY_CASE: dict[str, dict[str, str]] = {
    "torch-builtin": {},
    "smddp-builtin-spot": {},
    "torch-debugger": {},
    "s3-dataset-no-vpc": {},
    "torch-not-isolated": {},
}


@functools.cache
def _session(region: str) -> Session:
    """One SDK session per region (building one creates several boto3 clients: slow)."""
    boto_session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=region)
    client = mock.MagicMock()
    client.create_training_job.return_value = {"TrainingJobArn": "arn:recorded"}
    # No SDK defaults config: with one, the SDK validates it against its JSON schema at every
    # lookup (seconds per request). Telemetry is silenced in `_no_telemetry` instead.
    return Session(boto_session=boto_session, sagemaker_client=client, default_bucket=BUCKET)


@pytest.fixture(autouse=True)
def _no_telemetry() -> Iterator[None]:
    """The SDK reports usage over HTTPS; nothing may leave a test (the sockets are blocked too)."""
    with mock.patch.object(telemetry_logging, "_send_telemetry_request"):
        yield


def sdk_request(config: JobConfig, run: TrainingRun) -> dict[str, Any]:
    """The CreateTrainingJob request the SDK v2's PyTorch estimator sends for the same choices."""
    job_name = training_job_name(config, run)
    session = _session(config.region)
    client = session.sagemaker_client
    client.reset_mock()
    image = training_image(config)
    # The SDK resolves AWS's image itself from the framework and Python versions, except for
    # SMDDP: its SMDDP version table stops at PyTorch 2.2.0, while AWS's 2.3.0 image has SMDDP.
    resolve = (
        {"framework_version": config.framework_version, "py_version": config.py_version}
        if config.distribution == "torch"
        else {"image_uri": image}
    )
    if config.distribution == "torch":
        distribution: dict[str, Any] = {"torch_distributed": {"enabled": True}}
    else:
        distribution = {"smdistributed": {"dataparallel": {"enabled": True}}}
    if config.profiling == "debugger":
        profiling: dict[str, Any] = {
            "profiler_config": ProfilerConfig(
                s3_output_path=config.output_s3_uri,
                system_monitor_interval_millis=config.profiling_interval_ms,
            ),
            "rules": [ProfilerRule.sagemaker(getattr(rule_configs, spec.rule)()) for spec in config.rules],
        }
    else:
        profiling = {"disable_profiler": True}
    tags = {
        "retrain:dataset-version": run.dataset_version,
        "retrain:execution": run.execution,
        "retrain:code-sha256": run.code_sha256,
    }
    estimator = sagemaker_pytorch.PyTorch(
        entry_point=config.entry_point,
        source_dir=config.code_s3_uri,
        role=config.role_arn,
        instance_type=config.instance_type,
        instance_count=config.instance_count,
        volume_size=config.volume_size_gb,
        max_run=config.max_runtime_seconds,
        use_spot_instances=config.use_spot,
        max_wait=config.max_wait_seconds,
        output_path=config.output_s3_uri,
        checkpoint_s3_uri=(f"{config.checkpoint_base_uri}/{job_name}" if config.checkpointing else None),
        subnets=config.subnets or None,
        security_group_ids=config.security_group_ids or None,
        encrypt_inter_container_traffic=config.encrypt_inter_container_traffic,
        # The SDK then delivers the code as a `code` channel and points the container at it.
        enable_network_isolation=config.network_isolation,
        hyperparameters={
            **config.hyperparameters,
            "dataset-version": run.dataset_version,
            "backend": config.distribution,
        },
        metric_definitions=metric_definitions(),
        enable_sagemaker_metrics=True,
        container_log_level=config.container_log_level,
        environment={
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "100",
            "TRAINING_IMAGE_URI": image,
            "RETRAIN_PROFILING": config.profiling,
            "RETRAIN_PROFILING_INTERVAL_MS": str(config.profiling_interval_ms),
        },
        tags=[{"Key": key, "Value": value} for key, value in tags.items() if value],
        distribution=distribution,
        # No smdebug hook: its framework profiling is deprecated since PyTorch 2.0, and we never
        # asked for tensors.
        debugger_hook_config=False,
        sagemaker_session=session,
        **resolve,
        **profiling,
    )
    inputs: dict[str, Any] = {
        TRAIN_CHANNEL: (
            TrainingInput(config.dataset_s3_uri, input_mode="FastFile")
            if config.dataset_source == "s3"
            else FileSystemInput(
                file_system_id=config.fsx_file_system_id,
                file_system_type="FSxLustre",
                directory_path=f"/{config.fsx_mount_name}/{config.fsx_directory}",
                file_system_access_mode="ro",
            )
        )
    }
    if config.model_s3_uri:
        inputs["model"] = TrainingInput(config.model_s3_uri)
    estimator.fit(inputs=inputs, job_name=job_name, wait=False, logs=False)
    assert client.create_training_job.call_count == 1, "the SDK did not send exactly one request"
    request: dict[str, Any] = client.create_training_job.call_args.kwargs
    return request


def differences(ours: Any, theirs: Any, path: str = "") -> dict[str, tuple[Any, Any]]:
    """Every leaf where the two requests differ, by path (list order matters, dict order not)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(ours) | set(theirs)):
            child = f"{path}.{key}" if path else key
            if key not in ours or key not in theirs:
                found[child] = (ours.get(key, "<absent>"), theirs.get(key, "<absent>"))
            else:
                found.update(differences(ours[key], theirs[key], child))
        return found
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        found = {}
        for index, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            found.update(differences(mine, other, f"{path}[{index}]"))
        return found
    return {} if ours == theirs else {path: (ours, theirs)}


CASES: dict[str, dict[str, Any]] = {
    # The default: one GPU instance, torchrun, the trainer's own profiler, checkpoints on.
    "torch-builtin": {"instance_type": "ml.g5.12xlarge", "instance_count": 2},
    # SMDDP on two P4d hosts, on spot, with KMS keys and the accepted model as a second channel.
    "smddp-builtin-spot": {
        "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2,
        "distribution": "smddp",
        "framework_version": "2.3.0",
        "use_spot": True,
        "max_runtime_seconds": 7200,
        "max_wait_seconds": 14400,
        "model_s3_uri": f"s3://{BUCKET}/models/accepted/",
    },
    # No FSx: the dataset streamed from S3 (FastFile), and no VPC.
    "s3-dataset-no-vpc": {
        "dataset_source": "s3",
        "dataset_s3_uri": f"s3://{BUCKET}/dataset/",
        "fsx_file_system_id": None,
        "fsx_mount_name": None,
        "subnets": [],
        "security_group_ids": [],
    },
    # Without network isolation: the container downloads its code itself, no `code` channel.
    "torch-not-isolated": {"network_isolation": False},
    # Debugger on one single-GPU instance (checkpoints allowed: not distributed).
    "torch-debugger": {
        "instance_type": "ml.g5.2xlarge",
        "profiling": "debugger",
        "rules": [
            "ProfilerReport",
            "LowGPUUtilization",
            "CPUBottleneck",
            "IOBottleneck",
            "StepOutlier",
            "GPUMemoryIncrease",
            "BatchSize",
            "LoadBalancing",
        ],
    },
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_our_request_is_the_one_the_sdk_sends_for_the_same_job(case: str) -> None:
    config = job_config(**CASES[case])
    ours = build_training_job_request(config, RUN)
    theirs = sdk_request(config, RUN)

    found = differences(ours, theirs)
    explained = EXPLAINED_BY_CASE[case]

    unexplained = {path: pair for path, pair in found.items() if path not in explained}
    assert not unexplained, (
        f"{case}: our request differs from the SDK v2's at {len(unexplained)} place(s) nobody "
        f"explained (path: ours, SDK's): {unexplained}"
    )
    stale = sorted(set(explained) - set(found))
    assert not stale, f"{case}: explained differences that no longer exist: {stale}"


def test_the_sdk_sends_the_same_debugger_rule_parameters_we_default_to() -> None:
    for rule, defaults in PROFILER_RULE_DEFAULTS.items():
        sdk_rule = ProfilerRule.sagemaker(getattr(rule_configs, rule)())
        sdk_rule.image_uri = "image"
        sent = sdk_rule.to_profiler_rule_config_dict()["RuleParameters"]
        assert sent == {**defaults, "rule_to_invoke": rule}, (
            f"{rule}: the SDK sends {sent}, we send {defaults} plus rule_to_invoke"
        )


def test_smddp_on_p5_is_refused_by_us_and_by_the_sdk() -> None:
    p5 = job_config(instance_type="ml.p4d.24xlarge", distribution="smddp").model_copy(
        update={"instance_type": "ml.p5.48xlarge"}
    )

    with pytest.raises(JobConfigurationError, match=r"SMDDP does not support ml\.p5\.48xlarge"):
        build_training_job_request(p5, RUN)
    with pytest.raises(ValueError, match="SMDataParallel currently do not support p5"):
        sdk_request(p5, RUN)


@pytest.mark.parametrize("instance_type", ["ml.p3.16xlarge", "ml.g5.48xlarge"])
def test_we_refuse_smddp_where_the_sdk_still_lets_it_through(instance_type: str) -> None:
    """A known difference in refusals: the SDK v2 (given an image) checks only p5, while the
    current SMDDP documentation names P4d and P4de alone."""
    config = job_config(instance_type="ml.p4d.24xlarge", distribution="smddp").model_copy(
        update={"instance_type": instance_type}
    )

    with pytest.raises(JobConfigurationError, match=r"SMDDP runs only on ml\.p4d\.24xlarge"):
        build_training_job_request(config, RUN)
    assert sdk_request(config, RUN)["ResourceConfig"]["InstanceType"] == instance_type
