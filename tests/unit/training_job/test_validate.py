"""A request that would come back as a ValidationException minutes into a run is caught before it
leaves: botocore's model, plus the limits SageMaker checks on its side."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from functions.training_job.builder import build_training_job_request
from functions.training_job.errors import TrainingRequestInvalidError
from functions.training_job.validate import check_request, request_problems

from .helpers import RUN, job_config


@pytest.fixture
def request_() -> dict[str, Any]:
    return copy.deepcopy(build_training_job_request(job_config(profiling="debugger"), RUN))


def problem_with(request: dict[str, Any], fragment: str) -> None:
    problems = request_problems(request)
    assert any(fragment in problem for problem in problems), (
        f"expected a problem mentioning {fragment!r}, got {problems}"
    )
    with pytest.raises(TrainingRequestInvalidError):
        check_request(request)


def test_a_built_request_passes(request_: dict[str, Any]) -> None:
    assert request_problems(request_) == []


def test_a_job_name_sagemaker_refuses_is_caught(request_: dict[str, Any]) -> None:
    request_["TrainingJobName"] = "retrain_2026-05-01"

    problem_with(request_, "TrainingJobName: 'retrain_2026-05-01' does not match")


def test_a_job_name_over_63_characters_is_caught(request_: dict[str, Any]) -> None:
    request_["TrainingJobName"] = "r" * 64

    problem_with(request_, "TrainingJobName: 64 characters, at most 63 allowed")


def test_an_instance_type_sagemaker_does_not_train_on_is_caught(request_: dict[str, Any]) -> None:
    request_["ResourceConfig"]["InstanceType"] = "ml.p9.huge"

    problem_with(request_, "ResourceConfig.InstanceType: 'ml.p9.huge' is not one of")


def test_more_than_100_hyperparameters_are_caught(request_: dict[str, Any]) -> None:
    request_["HyperParameters"].update({f"flag-{n}": "1" for n in range(100)})

    problem_with(request_, "HyperParameters: 113 entries, at most 100 allowed")


def test_a_hyperparameter_value_over_2500_characters_is_caught(request_: dict[str, Any]) -> None:
    request_["HyperParameters"]["classes"] = "x" * 2501

    problem_with(request_, "HyperParameters.classes: 2501 characters, at most 2500 allowed")


def test_more_than_20_profiler_rules_are_caught(request_: dict[str, Any]) -> None:
    rule = request_["ProfilerRuleConfigurations"][0]
    request_["ProfilerRuleConfigurations"] = [{**rule, "RuleConfigurationName": f"r{n}"} for n in range(21)]

    problem_with(request_, "ProfilerRuleConfigurations: 21 entries, at most 20 allowed")


def test_a_tag_value_with_characters_aws_refuses_is_caught(request_: dict[str, Any]) -> None:
    request_["Tags"].append({"Key": "note", "Value": "drop #7"})

    problem_with(request_, "Tags[3].Value: 'drop #7' does not match")


def test_a_missing_required_member_is_caught_by_botocore(request_: dict[str, Any]) -> None:
    del request_["RoleArn"]

    problem_with(request_, 'Missing required parameter in input: "RoleArn"')


def test_a_wrong_type_is_caught_by_botocore(request_: dict[str, Any]) -> None:
    request_["ResourceConfig"]["InstanceCount"] = "2"

    problem_with(request_, "ResourceConfig.InstanceCount")


def test_a_keep_alive_beyond_the_maximum_is_caught(request_: dict[str, Any]) -> None:
    request_["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 21601

    problem_with(request_, "KeepAlivePeriodInSeconds: 21601 is above the maximum 21600")
