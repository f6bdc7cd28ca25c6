"""The image tables agree with AWS's own (as the SageMaker SDK v2 ships them), region by region."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from functions.training_job.errors import JobConfigurationError, UnsupportedRegionError
from functions.training_job.images import (
    DEBUGGER_RULE_ACCOUNTS,
    PYTORCH_PY_VERSIONS,
    PYTORCH_TRAINING_ACCOUNTS,
    processor_for,
    rule_evaluator_image_uri,
    training_image_uri,
)

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
# Run by `make test-sdk-parity`, in the SDK's own environment; skipped in .venv.
sagemaker = pytest.importorskip("sagemaker", reason="the SageMaker SDK v2: make test-sdk-parity")
from sagemaker import image_uris  # noqa: E402
from sagemaker.debugger import get_rule_container_image_uri  # noqa: E402

SDK_CONFIG = Path(sagemaker.__file__).parent / "image_uri_config"


def test_every_region_and_version_matches_the_sdks_image_table() -> None:
    sdk = json.loads((SDK_CONFIG / "pytorch.json").read_text())["training"]["versions"]
    for version, py_version in PYTORCH_PY_VERSIONS.items():
        assert sdk[version]["py_versions"] == [py_version], f"{version}: Python version differs"
        for region, account in PYTORCH_TRAINING_ACCOUNTS.items():
            assert sdk[version]["registries"].get(region) == account, (
                f"{version} in {region}: our registry {account}, the SDK's {sdk[version]['registries'].get(region)}"
            )


@pytest.mark.parametrize(
    ("region", "version", "instance_type"),
    [
        ("eu-west-1", "2.3.0", "ml.p4d.24xlarge"),
        ("us-east-1", "2.8.0", "ml.c5.xlarge"),
        ("cn-north-1", "2.3.0", "ml.g5.2xlarge"),
        ("us-gov-west-1", "2.5.1", "ml.p5.48xlarge"),
        ("ap-east-2", "2.7.1", "ml.m5.xlarge"),
    ],
)
def test_the_training_image_is_the_one_the_sdk_resolves(region: str, version: str, instance_type: str) -> None:
    py_version = PYTORCH_PY_VERSIONS[version]

    ours = training_image_uri(region, version, py_version, processor_for(instance_type))
    theirs = image_uris.retrieve(
        "pytorch",
        region=region,
        version=version,
        py_version=py_version,
        instance_type=instance_type,
        image_scope="training",
    )

    assert ours == theirs


def test_the_only_sdk_regions_left_out_are_the_iso_partitions() -> None:
    sdk = json.loads((SDK_CONFIG / "pytorch.json").read_text())["training"]["versions"]
    regions = {region for version in PYTORCH_PY_VERSIONS for region in sdk[version]["registries"]}

    missing = sorted(regions - set(PYTORCH_TRAINING_ACCOUNTS))

    assert all("-iso" in region for region in missing), f"regions left out: {missing}"
    assert set(PYTORCH_TRAINING_ACCOUNTS) <= regions


def test_every_debugger_rule_image_is_the_one_the_sdk_resolves() -> None:
    sdk = json.loads((SDK_CONFIG / "debugger.json").read_text())["versions"]["latest"]

    assert sdk["registries"] == DEBUGGER_RULE_ACCOUNTS
    # The table is the SDK's; a few regions check the URI's shape (each lookup is slow).
    for region in ("eu-west-1", "cn-north-1", "us-gov-west-1"):
        assert rule_evaluator_image_uri(region) == get_rule_container_image_uri("LowGPUUtilization", region)


def test_china_images_live_under_their_own_domain() -> None:
    assert training_image_uri("cn-north-1", "2.3.0", "py311", "gpu") == (
        "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/pytorch-training:2.3.0-gpu-py311"
    )
    assert rule_evaluator_image_uri("cn-northwest-1") == (
        "658757709296.dkr.ecr.cn-northwest-1.amazonaws.com.cn/sagemaker-debugger-rules:latest"
    )


@pytest.mark.parametrize(
    "region",
    ["ap-southeast-3", "ap-southeast-4", "eu-south-2", "me-central-1", "ap-south-2", "eu-central-2", "us-gov-east-1"],
)
def test_debugger_is_unavailable_where_the_sdk_says_so(region: str) -> None:
    assert region in PYTORCH_TRAINING_ACCOUNTS, "training itself runs there"
    with pytest.raises(UnsupportedRegionError, match=f"not available in region '{region}'"):
        rule_evaluator_image_uri(region)


def test_an_unknown_region_has_no_training_image() -> None:
    with pytest.raises(UnsupportedRegionError, match="set image_uri to an image you host"):
        training_image_uri("xx-nowhere-1", "2.3.0", "py311", "gpu")


def test_a_torch_version_aws_builds_for_another_python_is_refused() -> None:
    with pytest.raises(JobConfigurationError, match="for py312 only, not py311"):
        training_image_uri("eu-west-1", "2.8.0", "py311", "gpu")


def test_a_torch_version_this_project_does_not_run_on_is_refused() -> None:
    with pytest.raises(JobConfigurationError, match=r"framework_version '2\.1\.0' is not one"):
        training_image_uri("eu-west-1", "2.1.0", "py310", "gpu")


@pytest.mark.parametrize(
    ("instance_type", "processor"),
    [("ml.p4d.24xlarge", "gpu"), ("ml.g5.2xlarge", "gpu"), ("ml.c5.xlarge", "cpu"), ("ml.m7i.large", "cpu")],
)
def test_gpu_families_get_gpu_images(instance_type: str, processor: str) -> None:
    assert processor_for(instance_type) == processor
