"""After a job profiled by SageMaker Debugger, the engineers read the same rule verdicts the
built-in profiler would give them, whatever state Debugger's rule jobs are in."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.validate import ParamValidator
from moto import mock_aws

from functions.common.debugger import (
    EVIDENCE_ITEMS,
    normalise_debugger_results,
    read_profiler_reports,
)
from functions.common.errors import DebuggerResultsError
from functions.common.rules import RuleResult, RulesFile, parse_rules_file

from .helpers import EVENTS, load_sagemaker_event, profiler_reports

NOW = datetime(2026, 5, 1, 14, 10, tzinfo=UTC)
JOB = "retrain-2026-05-01-27825959"
OUTPUT = f"s3://retrain-data-123456789012-eu-west-1/training/{JOB}/rule-output"
REPORT = f"{OUTPUT}/ProfilerReport/profiler-output/profiler-report.html"
STATUS_FILES = sorted(path.name for path in EVENTS.glob("describe_*.json"))


def normalise(event: str, *reports: str, every_report: bool = False) -> RulesFile:
    files = profiler_reports() if every_report else (profiler_reports(*reports) if reports else {})
    return normalise_debugger_results(load_sagemaker_event(event), files, generated_at=NOW)


def by_name(rules: RulesFile) -> dict[str, RuleResult]:
    return {rule.name: rule for rule in rules.rules}


def statuses(rules: RulesFile) -> dict[str, str]:
    return {rule.name: rule.status for rule in rules.rules}


@pytest.mark.parametrize("name", STATUS_FILES)
def test_every_event_file_is_a_real_describe_training_job_response(name: str) -> None:
    shape = (
        botocore.session.get_session()
        .get_service_model("sagemaker")
        .operation_model("DescribeTrainingJob")
        .output_shape
    )
    response = load_sagemaker_event(name)
    response.pop("ResponseMetadata")

    report = ParamValidator().validate(response, shape)

    assert not report.has_errors(), f"{name}: {report.generate_report()}"


def test_rules_still_running_after_the_job_completed_are_reported_as_pending() -> None:
    rules = normalise("describe_completed_rules_in_progress.json")

    assert statuses(rules) == {
        "ProfilerReport": "InProgress",
        "LowGPUUtilization": "InProgress",
        "CPUBottleneck": "NoIssuesFound",
        "IOBottleneck": "NoIssuesFound",
        "StepOutlier": "InProgress",
    }
    assert rules.pending == ["ProfilerReport", "LowGPUUtilization", "StepOutlier"]
    assert "wait for the verdict" in by_name(rules)["LowGPUUtilization"].recommendation


def test_partial_reports_of_a_running_profiler_report_stay_pending() -> None:
    rules = normalise("describe_completed_rules_in_progress.json", "LoadBalancing", "BatchSize")

    assert statuses(rules)["LoadBalancing"] == "InProgress", "a partial file is no verdict yet"
    assert by_name(rules)["LoadBalancing"].trigger_count == 1, "what it saw so far is kept"


def test_issues_found_come_with_evidence_and_plain_advice() -> None:
    rules = normalise("describe_completed_issues_found.json", every_report=True)
    found = by_name(rules)

    assert rules.pending == []
    assert [rule.name for rule in rules.issues] == [
        "ProfilerReport",
        "LowGPUUtilization",
        "StepOutlier",
        "LoadBalancing",
    ]
    low_gpu = found["LowGPUUtilization"]
    assert low_gpu.trigger_count == 3
    assert (low_gpu.violations, low_gpu.datapoints) == (3, 13844)
    assert low_gpu.evidence == {
        "algo-1": {"gpu2": {"gpu_95": 41.0, "gpu_5": 0.0}, "gpu3": {"gpu_95": 38.5, "gpu_5": 0.0}}
    }
    assert low_gpu.parameters["threshold_p95"] == "70"
    assert "data loader more workers" in low_gpu.recommendation
    assert low_gpu.detail and low_gpu.detail.startswith("RuleEvaluationConditionMet")
    assert low_gpu.source == "debugger"
    assert found["ProfilerReport"].evidence == {
        "rules_with_issues": ["LoadBalancing", "LowGPUUtilization", "StepOutlier"]
    }
    assert found["CPUBottleneck"].status == "NoIssuesFound"
    assert found["CPUBottleneck"].recommendation == ""


def test_rules_only_profiler_report_ran_get_their_verdict_from_its_files() -> None:
    rules = normalise("describe_completed_issues_found.json", every_report=True)

    assert statuses(rules) == {
        "ProfilerReport": "IssuesFound",
        "LowGPUUtilization": "IssuesFound",
        "CPUBottleneck": "NoIssuesFound",
        "IOBottleneck": "NoIssuesFound",
        "StepOutlier": "IssuesFound",
        "BatchSize": "NoIssuesFound",
        "GPUMemoryIncrease": "NoIssuesFound",
        "LoadBalancing": "IssuesFound",
        "MaxInitializationTime": "NoIssuesFound",
        "OverallSystemUsage": "NoIssuesFound",
    }
    assert by_name(rules)["OverallSystemUsage"].evidence["GPU"]["algo-1"]["p50"] == 71.5


def test_long_evidence_is_cut_to_what_a_notification_can_show() -> None:
    step_outlier = by_name(normalise("describe_completed_issues_found.json", "StepOutlier"))["StepOutlier"]

    details = step_outlier.evidence["step_details"]["algo-1"]
    assert len(details["probs"]) == EVIDENCE_ITEMS + 1
    assert details["probs"][-1] == "... 80 more"
    assert details["step_numbers"][:3] == [600, 1200, 1800]
    assert details["step_stats"]["max"] == 9.871


def test_no_issues_everywhere() -> None:
    quiet = (
        "CPUBottleneck",
        "IOBottleneck",
        "GPUMemoryIncrease",
        "BatchSize",
        "MaxInitializationTime",
        "OverallSystemUsage",
    )
    rules = normalise("describe_completed_no_issues.json", *quiet)

    assert set(statuses(rules).values()) == {"NoIssuesFound"}
    assert rules.issues == [] and rules.pending == []
    assert by_name(rules)["ProfilerReport"].trigger_count == 0


def test_a_rule_that_failed_says_so_and_why() -> None:
    rules = normalise("describe_completed_rules_error.json", "GPUMemoryIncrease")
    found = by_name(rules)

    assert found["LowGPUUtilization"].status == "Error"
    assert found["LowGPUUtilization"].detail == (
        "InternalServerError: We encountered an internal error. Please try again."
    )
    assert "could not be evaluated" in found["LowGPUUtilization"].recommendation
    assert found["ProfilerReport"].detail and "No profiler data" in found["ProfilerReport"].detail
    assert found["GPUMemoryIncrease"].status == "Error", "its parent failed: no verdict"
    assert found["CPUBottleneck"].status == "NoIssuesFound"


def test_a_stopping_job_has_stopping_rules() -> None:
    rules = normalise("describe_stopping_rules_stopping.json")

    assert set(statuses(rules).values()) == {"Stopping"}
    assert rules.pending == list(statuses(rules)), "Stopping is not final: wait"


def test_a_stopped_job_has_stopped_rules_and_keeps_finished_verdicts() -> None:
    rules = normalise("describe_stopped_rules_stopped.json", "BatchSize")

    assert statuses(rules) == {
        "ProfilerReport": "Stopped",
        "LowGPUUtilization": "Stopped",
        "CPUBottleneck": "NoIssuesFound",
        "IOBottleneck": "Stopped",
        "StepOutlier": "Stopped",
        "BatchSize": "Stopped",
    }
    assert rules.pending == []
    assert "stopped before it reached a verdict" in by_name(rules)["StepOutlier"].recommendation


def test_a_job_without_profiler_rules_has_none() -> None:
    rules = normalise("describe_completed_no_profiler_rules.json")

    assert rules.rules == []
    assert rules.report_uri is None
    assert rules.job_name == JOB


def test_links_point_at_the_report_debugger_wrote() -> None:
    rules = normalise("describe_completed_issues_found.json", "LowGPUUtilization")
    found = by_name(rules)

    assert rules.report_uri == REPORT
    assert found["LowGPUUtilization"].report_uri == REPORT
    assert found["CPUBottleneck"].report_uri == f"{OUTPUT}/CPUBottleneck/", (
        "a rule without a ProfilerReport file links to its own output"
    )


def test_the_normalised_file_round_trips_as_rules_json() -> None:
    rules = normalise("describe_completed_issues_found.json", every_report=True)

    again = parse_rules_file(rules.model_dump_json())

    assert again == rules
    assert again.backend == "debugger"
    assert again.generated_at == NOW


def test_a_renamed_rule_keeps_its_own_verdict_but_not_the_defaults_evidence() -> None:
    event = load_sagemaker_event("describe_completed_issues_found.json")
    event["ProfilerRuleConfigurations"][1]["RuleConfigurationName"] = "LowGPUUtilization-strict"
    event["ProfilerRuleEvaluationStatuses"][1]["RuleConfigurationName"] = "LowGPUUtilization-strict"

    rules = normalise_debugger_results(event, profiler_reports("LowGPUUtilization"), generated_at=NOW)
    found = by_name(rules)

    assert found["LowGPUUtilization-strict"].status == "IssuesFound"
    assert found["LowGPUUtilization-strict"].evidence == {}
    assert found["LowGPUUtilization-strict"].parameters["threshold_p95"] == "70"
    assert found["LowGPUUtilization"].status == "IssuesFound", "ProfilerReport's own verdict"


def test_a_response_that_is_not_describe_training_job_is_named() -> None:
    with pytest.raises(DebuggerResultsError, match="not a DescribeTrainingJob response"):
        normalise_debugger_results({"TrainingJobName": JOB}, generated_at=NOW)


def test_a_report_of_another_shape_is_named() -> None:
    event = load_sagemaker_event("describe_completed_issues_found.json")

    with pytest.raises(DebuggerResultsError, match="report of LowGPUUtilization"):
        normalise_debugger_results(event, {"LowGPUUtilization": {"RuleTriggered": "often"}}, generated_at=NOW)


@mock_aws
def test_the_report_files_are_read_from_where_debugger_writes_them() -> None:
    s3 = boto3.client("s3", region_name="eu-west-1")
    bucket = "retrain-data-123456789012-eu-west-1"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    folder = f"training/{JOB}/rule-output/ProfilerReport/profiler-output/profiler-reports/"
    files: dict[str, Any] = profiler_reports("LowGPUUtilization", "StepOutlier")
    for name, content in files.items():
        s3.put_object(Bucket=bucket, Key=f"{folder}{name}.json", Body=json.dumps(content))
    s3.put_object(Bucket=bucket, Key=f"{folder}algo-1_box_plot_gpu_utilization.png", Body=b"png")
    s3.put_object(Bucket=bucket, Key=f"{folder}plots/CPUBottleneck.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=folder.replace("profiler-reports/", "report.html"), Body=b"")

    found = read_profiler_reports(s3, load_sagemaker_event("describe_completed_issues_found.json"))

    assert found == files
