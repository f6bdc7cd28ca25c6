"""An engineer describes the job in a file; the deployment adds environment variables; the command
line has the last word. Defaults fill the rest, and a mistake is named."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from functions.common.debugger import PROFILER_RULE_DEFAULTS, ProfilerRuleName
from functions.training_job.config import (
    DEFAULT_RULES,
    JobConfig,
    environment_values,
    load_job_config,
)
from functions.training_job.errors import JobConfigFileError, JobConfigurationError
from functions.training_job.images import PYTORCH_PY_VERSIONS

from .helpers import SETTINGS

YAML = """\
role_arn: arn:aws:iam::123456789012:role/RetrainTraining
output_s3_uri: s3://retrain-data/training/
code_s3_uri: s3://retrain-data/code/sourcedir.tar.gz
fsx_file_system_id: fs-0123456789abcdef0
fsx_mount_name: abcdefgh
subnets: [subnet-0a1b2c3d4e5f60718]
security_group_ids: [sg-0a1b2c3d4e5f60718]
instance_type: ml.g5.12xlarge
profiling: debugger
rules:
  - ProfilerReport
  - rule: LowGPUUtilization
    parameters: {threshold_p95: 60}
hyperparameters:
  epochs: 50
  amp: true
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_yaml_file_gives_the_job_and_defaults_fill_the_rest(tmp_path: Path) -> None:
    config = load_job_config(write(tmp_path, "job.yaml", YAML), environ={"AWS_REGION": "eu-west-1"})

    assert config.region == "eu-west-1", "the region falls back to the function's own"
    assert config.instance_type == "ml.g5.12xlarge"
    names = [rule.configuration_name for rule in config.rules]
    assert names == ["ProfilerReport", "LowGPUUtilization"]
    assert config.rules[1].parameters == {"threshold_p95": 60}
    assert config.hyperparameters == {"epochs": 50, "amp": True}
    documented_defaults = {
        "instance_count": 1,
        "volume_size_gb": 50,
        "max_runtime_seconds": 86400,
        "framework_version": "2.8.0",
        "py_version": "py312",
        "entry_point": "train.py",
        "distribution": "torch",
        "profiling_interval_ms": 500,
        "use_spot": False,
        "max_wait_seconds": None,
        "checkpointing": True,
        "encrypt_inter_container_traffic": True,
        "fsx_directory": "dataset",
        "job_name_prefix": "retrain",
        "container_log_level": 20,
    }
    actual = {name: getattr(config, name) for name in documented_defaults}
    assert actual == documented_defaults


def test_the_default_rules_are_the_designs_five() -> None:
    config = JobConfig.model_validate({**SETTINGS, "region": "eu-west-1"})

    assert tuple(rule.rule for rule in config.rules) == DEFAULT_RULES
    assert DEFAULT_RULES == (
        "ProfilerReport",
        "LowGPUUtilization",
        "CPUBottleneck",
        "IOBottleneck",
        "StepOutlier",
    )
    assert config.profiling == "builtin", "Debugger is opt-in: closed to new AWS customers"


def test_every_rule_a_configuration_may_name_has_its_defaults() -> None:
    # The names are written out for the configuration's type; the table is what a request sends.
    assert set(get_args(ProfilerRuleName)) == set(PROFILER_RULE_DEFAULTS)


def test_the_default_image_is_the_newest_aws_publishes_in_the_table() -> None:
    config = JobConfig.model_validate(SETTINGS)

    newest = max(PYTORCH_PY_VERSIONS, key=lambda version: tuple(int(part) for part in version.split(".")))
    assert (config.framework_version, config.py_version) == (newest, PYTORCH_PY_VERSIONS[newest])


def test_ci_runs_the_trainers_tests_under_the_default_images_torch_and_python() -> None:
    """`make test-trainer-image-torch` (in CI) installs these: a newer default must move them."""
    makefile = (Path(__file__).parents[3] / "Makefile").read_text(encoding="utf-8")
    settings = dict(re.findall(r"^(IMAGE_TORCH_VERSION|IMAGE_PYTHON_VERSION) := (\S+)$", makefile, re.MULTILINE))
    config = JobConfig.model_validate(SETTINGS)

    assert settings == {
        "IMAGE_TORCH_VERSION": config.framework_version,
        "IMAGE_PYTHON_VERSION": f"{config.py_version[2]}.{config.py_version[3:]}",
    }, "the Makefile's trainer-image environment must follow the default image"


@pytest.mark.parametrize(("version", "python"), [("2.3.0", "py311"), ("2.6.0", "py312")])
def test_naming_only_the_framework_version_gives_the_python_aws_built_it_for(version: str, python: str) -> None:
    config = load_job_config(environ={"TRAINING_JOB_FRAMEWORK_VERSION": version}, overrides=SETTINGS)

    assert config.py_version == python


def test_a_python_version_given_is_kept_for_the_refusals_to_judge() -> None:
    config = JobConfig.model_validate({**SETTINGS, "framework_version": "2.3.0", "py_version": "py312"})

    assert config.py_version == "py312"


def test_a_json_file_works_as_well(tmp_path: Path) -> None:
    path = write(tmp_path, "job.json", json.dumps(SETTINGS))

    assert load_job_config(path, environ={}).fsx_mount_name == "abcdefgh"


def test_the_environment_overrides_the_file_and_flags_override_both(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", YAML)
    environ = {
        "AWS_REGION": "eu-west-1",
        "TRAINING_JOB_REGION": "us-east-1",
        "TRAINING_JOB_INSTANCE_TYPE": "ml.p4d.24xlarge",
        "TRAINING_JOB_INSTANCE_COUNT": "4",
        "TRAINING_JOB_SUBNETS": '["subnet-1", "subnet-2"]',
        "TRAINING_JOB_USE_SPOT": "true",
        "TRAINING_JOB_MAX_WAIT_SECONDS": "172800",
        "TRAINING_JOB_PROFILING_INTERVAL_MS": "1000",
        "TRAINING_JOB_DISTRIBUTION": "smddp",
        "TRAINING_JOB_TAGS": '{"team": "perception"}',
    }

    flags = {"instance_count": 2, "profiling": None}

    config = load_job_config(path, environ=environ, overrides=flags)

    assert config.region == "us-east-1", "TRAINING_JOB_REGION beats AWS_REGION"
    assert config.instance_type == "ml.p4d.24xlarge"
    assert config.instance_count == 2, "a flag beats the environment"
    assert config.profiling == "debugger", "a flag left out (None) changes nothing"
    assert config.subnets == ["subnet-1", "subnet-2"]
    assert (config.use_spot, config.max_wait_seconds) == (True, 172800)
    assert config.profiling_interval_ms == 1000
    assert config.distribution == "smddp"
    assert config.tags == {"team": "perception"}


def test_a_text_setting_from_the_environment_is_taken_as_written() -> None:
    environ = {"TRAINING_JOB_FSX_MOUNT_NAME": "12345678", "TRAINING_JOB_IMAGE_URI": "1"}

    values = environment_values(environ)

    assert values == {"fsx_mount_name": "12345678", "image_uri": "1"}


def test_an_unknown_setting_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", YAML + "instance_typ: ml.p4d.24xlarge\n")

    with pytest.raises(JobConfigurationError, match="instance_typ: Extra inputs are not permitted"):
        load_job_config(path, environ={"AWS_REGION": "eu-west-1"})


def test_every_missing_setting_is_named_at_once() -> None:
    with pytest.raises(JobConfigurationError) as caught:
        load_job_config(None, environ={})

    missing = {reason.split(":")[0] for reason in caught.value.reasons}
    # Where the dataset is (the FSx file system, or dataset_s3_uri) is checked with the combinations
    # (tests/unit/training_job/test_refusals.py): which fields it needs depends on dataset_source.
    required = {"region", "role_arn", "output_s3_uri"}
    assert missing == required
    assert "TRAINING_JOB_ROLE_ARN" in str(caught.value), "the message says how to set it"


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("job.yaml", "- a list\n- of things\n", "must hold a mapping of settings, not list"),
        ("job.yaml", "role_arn: [unclosed\n", "is not valid YAML"),
        ("job.json", "{'single': 'quotes'}", "is not valid JSON"),
    ],
)
def test_a_file_that_is_not_a_settings_mapping_is_a_file_error(
    tmp_path: Path, name: str, text: str, fragment: str
) -> None:
    with pytest.raises(JobConfigFileError, match=fragment):
        load_job_config(write(tmp_path, name, text), environ={})


def test_a_missing_file_is_a_file_error(tmp_path: Path) -> None:
    with pytest.raises(JobConfigFileError, match="cannot read the job configuration"):
        load_job_config(tmp_path / "nowhere.yaml", environ={})


def test_the_same_rule_twice_needs_a_second_name() -> None:
    settings: dict[str, Any] = {**SETTINGS, "rules": ["LowGPUUtilization", "LowGPUUtilization"]}

    with pytest.raises(JobConfigurationError, match="LowGPUUtilization appears twice"):
        load_job_config(None, environ={}, overrides=settings)
