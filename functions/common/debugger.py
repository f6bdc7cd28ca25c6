"""SageMaker Debugger's built-in profiler rules: what can be asked for, and what came back.

- `PROFILER_RULE_DEFAULTS`: the rules a job may request, with the parameters the SageMaker SDK v2
  sends for each (`sagemaker.debugger.rule_configs`), so our request matches the SDK's.
- `normalise_debugger_results`: a DescribeTrainingJob response plus the report files Debugger
  writes (`<output>/<job>/rule-output/ProfilerReport/profiler-output/profiler-reports/<Rule>.json`)
  -> `RulesFile`, the same model the built-in back end writes, every status included.

How statuses are read (DescribeTrainingJob's `ProfilerRuleEvaluationStatuses`):
- a rule configured on its own gets its status from its own evaluation job; its evidence comes from
  ProfilerReport's file for that rule when there is one;
- ProfilerReport runs every rule (plus summaries) and writes one file per rule: the rules that have
  a file but no evaluation of their own are listed too, with a verdict from their file once
  ProfilerReport has finished (`RuleTriggered > 0` is IssuesFound), and ProfilerReport's own status
  while it is still InProgress, Stopping, Stopped or in Error (their files are then partial).

Shared by two functions, so it lives in `common/`: TrainingJob requests the rules (config.py and
builder.py read the table), EvaluateRun reads their results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from functions.common.errors import DebuggerResultsError
from functions.common.prefixes import split_s3_uri
from functions.common.rules import RuleResult, RulesFile, RuleStatus

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PROFILER_REPORT: Final = "ProfilerReport"

# The built-in profiler rules a job configuration may name: exactly the keys of the table below
# (a test checks it), written out because a Literal type cannot be built from the table.
ProfilerRuleName = Literal[
    "ProfilerReport",
    "LowGPUUtilization",
    "CPUBottleneck",
    "IOBottleneck",
    "StepOutlier",
    "GPUMemoryIncrease",
    "BatchSize",
    "LoadBalancing",
    "MaxInitializationTime",
    "OverallSystemUsage",
]
_SCAN = {"scan_interval_us": "60000000"}
# Parameters the SDK v2 sends for each built-in profiler rule (values as the API takes them): the
# only copy on the functions' side. The built-in back end's are in trainer/profiling/rules/common.py,
# which cannot import this (tests/unit/test_rule_defaults_agree.py keeps the two in step).
PROFILER_RULE_DEFAULTS: dict[ProfilerRuleName, dict[str, str]] = {
    PROFILER_REPORT: {},
    "LowGPUUtilization": {
        "threshold_p95": "70",
        "threshold_p5": "10",
        "window": "500",
        "patience": "1000",
        **_SCAN,
    },
    "CPUBottleneck": {
        "threshold": "50",
        "gpu_threshold": "10",
        "cpu_threshold": "90",
        "patience": "1000",
        **_SCAN,
    },
    "IOBottleneck": {
        "threshold": "50",
        "gpu_threshold": "10",
        "io_threshold": "50",
        "patience": "1000",
        **_SCAN,
    },
    # "None" is what the SDK sends (str(None)); the rule then checks every phase.
    "StepOutlier": {"stddev": "3", "mode": "None", "n_outliers": "10", **_SCAN},
    "GPUMemoryIncrease": {"increase": "5", "patience": "1000", "window": "10", **_SCAN},
    "BatchSize": {
        "cpu_threshold_p95": "70",
        "gpu_threshold_p95": "70",
        "gpu_memory_threshold_p95": "70",
        "patience": "1000",
        "window": "500",
        **_SCAN,
    },
    "LoadBalancing": {"threshold": "0.5", "patience": "1000", **_SCAN},
    "MaxInitializationTime": {"threshold": "20", **_SCAN},
    "OverallSystemUsage": {**_SCAN},
}

# What to try when a rule finds issues, in plain words (after the Debugger developer guide).
RECOMMENDATIONS: dict[str, str] = {
    PROFILER_REPORT: "Some rules found issues: see each of them and the profiling report.",
    "LowGPUUtilization": (
        "GPUs were under-used or their use swung widely: give the data loader more workers, raise "
        "the batch size, or choose a smaller instance type."
    ),
    "CPUBottleneck": (
        "The CPUs kept the GPUs waiting: use more data-loader workers, make preprocessing lighter, "
        "or choose an instance type with more CPU cores per GPU."
    ),
    "IOBottleneck": (
        "Waiting on storage left the GPUs idle: prefetch more batches, use more data-loader "
        "workers, or raise the FSx file system's throughput."
    ),
    "StepOutlier": (
        "Some steps took far longer than the rest: look for periodic work in the loop "
        "(checkpoints, evaluation), slow ranks, or data stalls."
    ),
    "GPUMemoryIncrease": (
        "GPU memory kept growing: look for tensors kept across steps (a loss summed without "
        ".item(), say) before it runs out."
    ),
    "BatchSize": (
        "CPUs, GPUs and GPU memory were all lightly used: raise the batch size or choose a smaller instance type."
    ),
    "LoadBalancing": (
        "The GPUs of a host did unequal work: check that every rank gets the same share of data "
        "and that each process drives one GPU."
    ),
    "MaxInitializationTime": (
        "Training took long to reach its first step: check data mounting, downloads and set-up before the loop."
    ),
    "Dataloader": (
        "The number of data-loader processes does not fit the CPU count: set --workers near the "
        "number of cores per GPU."
    ),
}
_BY_STATUS: dict[str, str] = {
    "Error": "The rule could not be evaluated (see detail); the training result is not affected.",
    "InProgress": "Still being evaluated: wait for the verdict before acting on it.",
    "Stopping": "The evaluation is being stopped; it will give no verdict.",
    "Stopped": "The evaluation was stopped before it reached a verdict.",
}

# Evidence goes into notifications: lists and maps longer than this are cut, with a count.
EVIDENCE_ITEMS = 20


class _RuleConfiguration(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(alias="RuleConfigurationName")
    parameters: dict[str, str] = Field(default_factory=dict, alias="RuleParameters")


class _RuleEvaluation(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(alias="RuleConfigurationName")
    status: RuleStatus = Field(alias="RuleEvaluationStatus")
    details: str | None = Field(default=None, alias="StatusDetails")
    job_arn: str | None = Field(default=None, alias="RuleEvaluationJobArn")
    modified: datetime | None = Field(default=None, alias="LastModifiedTime")


class _OutputDataConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    s3_output_path: str = Field(alias="S3OutputPath")


class DescribedTrainingJob(BaseModel):
    """What normalisation needs from a DescribeTrainingJob response (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    job_name: str = Field(alias="TrainingJobName")
    job_status: str = Field(alias="TrainingJobStatus")
    output: _OutputDataConfig = Field(alias="OutputDataConfig")
    profiler_rules: list[_RuleConfiguration] = Field(default_factory=list, alias="ProfilerRuleConfigurations")
    profiler_statuses: list[_RuleEvaluation] = Field(default_factory=list, alias="ProfilerRuleEvaluationStatuses")
    debug_rules: list[_RuleConfiguration] = Field(default_factory=list, alias="DebugRuleConfigurations")
    debug_statuses: list[_RuleEvaluation] = Field(default_factory=list, alias="DebugRuleEvaluationStatuses")

    def rule_output_uri(self, configuration_name: str) -> str:
        """Where SageMaker puts a rule's output when its configuration names no S3OutputPath."""
        base = self.output.s3_output_path.rstrip("/")
        return f"{base}/{self.job_name}/rule-output/{configuration_name}/"

    @property
    def profiler_report_uri(self) -> str:
        return f"{self.rule_output_uri(PROFILER_REPORT)}profiler-output/profiler-report.html"

    @property
    def profiler_reports_uri(self) -> str:
        """The folder holding ProfilerReport's `<Rule>.json` files."""
        return f"{self.rule_output_uri(PROFILER_REPORT)}profiler-output/profiler-reports/"


class DebuggerRuleReport(BaseModel):
    """`profiler-reports/<Rule>.json`, as smdebug's rules fill their `report` dictionary."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    rule_triggered: int = Field(default=0, ge=0, alias="RuleTriggered")
    violations: int = Field(default=0, ge=0, alias="Violations")
    details: dict[str, Any] = Field(default_factory=dict, alias="Details")
    datapoints: int = Field(default=0, ge=0, alias="Datapoints")
    # "name:value" lines, e.g. "threshold_p95:70\nthreshold_p5:10".
    rule_parameters: str = Field(default="", alias="RuleParameters")

    @property
    def parameters(self) -> dict[str, str]:
        pairs = (line.partition(":") for line in self.rule_parameters.splitlines())
        return {name.strip(): value.strip() for name, sep, value in pairs if sep and name.strip()}


def describe_job(describe: Mapping[str, Any]) -> DescribedTrainingJob:
    try:
        return DescribedTrainingJob.model_validate(describe)
    except ValidationError as exc:
        raise DebuggerResultsError(f"not a DescribeTrainingJob response: {exc.errors(include_url=False)}") from exc


def normalise_debugger_results(
    describe: Mapping[str, Any],
    reports: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    generated_at: datetime,
) -> RulesFile:
    """Debugger's rule results for one job as `rules.json`.

    `describe` is the DescribeTrainingJob response; `reports` maps a rule name to the content of
    its `profiler-reports/<Rule>.json` (see `read_profiler_reports`), empty while none exist.
    """
    job = describe_job(describe)
    parsed = {name: _report(name, content) for name, content in (reports or {}).items()}
    configurations = {rule.name: rule for rule in (*job.profiler_rules, *job.debug_rules)}
    evaluations = [*job.profiler_statuses, *job.debug_statuses]

    results: list[RuleResult] = []
    umbrella: _RuleEvaluation | None = None
    for evaluation in evaluations:
        configuration = configurations.get(evaluation.name)
        parameters = dict(configuration.parameters) if configuration else {}
        rule = parameters.pop("rule_to_invoke", evaluation.name)
        if rule == PROFILER_REPORT:
            umbrella = evaluation
            continue
        # ProfilerReport's file for this rule ran with its defaults: use it only for the
        # configuration that carries the rule's own name, not for a renamed variant.
        report = parsed.get(rule) if evaluation.name == rule else None
        results.append(
            _result(
                evaluation.name,
                evaluation.status,
                report,
                parameters=parameters,
                detail=evaluation.details,
                report_uri=(job.profiler_report_uri if report else job.rule_output_uri(evaluation.name)),
            )
        )

    report_uri: str | None = None
    if umbrella is not None:
        report_uri = job.profiler_report_uri
        covered = {result.name for result in results}
        # Rules ProfilerReport ran without an evaluation of their own.
        extra = [
            _result(
                name,
                _verdict(umbrella.status, report),
                report,
                parameters={},
                detail=None,
                report_uri=report_uri,
            )
            for name, report in sorted(parsed.items())
            if name not in covered and name != PROFILER_REPORT
        ]
        triggered = sorted(name for name, report in parsed.items() if report.rule_triggered)
        results = [
            RuleResult(
                name=umbrella.name,
                status=umbrella.status,
                trigger_count=len(triggered),
                evidence={"rules_with_issues": triggered} if triggered else {},
                recommendation=_recommendation(PROFILER_REPORT, umbrella.status),
                detail=umbrella.details,
                source="debugger",
                report_uri=report_uri,
            ),
            *results,
            *extra,
        ]
    return RulesFile(
        backend="debugger",
        job_name=job.job_name,
        generated_at=generated_at,
        report_uri=report_uri,
        rules=results,
    )


def read_profiler_reports(s3: S3Client, describe: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every `profiler-reports/<Rule>.json` of the job, by rule name (none yet: empty)."""
    bucket, prefix = split_s3_uri(describe_job(describe).profiler_reports_uri)
    reports: dict[str, dict[str, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            name = key.removeprefix(prefix)
            if "/" in name or not name.endswith(".json"):
                continue  # images and notebooks beside the rule files
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            try:
                reports[name.removesuffix(".json")] = json.loads(body)
            except ValueError as exc:
                raise DebuggerResultsError(f"s3://{bucket}/{key} is not JSON: {exc}") from exc
    return reports


def _report(name: str, content: Mapping[str, Any]) -> DebuggerRuleReport:
    try:
        return DebuggerRuleReport.model_validate(content)
    except ValidationError as exc:
        raise DebuggerResultsError(
            f"the Debugger report of {name} does not have the documented shape: {exc.errors(include_url=False)}"
        ) from exc


def _verdict(umbrella: RuleStatus, report: DebuggerRuleReport) -> RuleStatus:
    """A sub-rule's status: its own verdict once ProfilerReport has finished, else ProfilerReport's
    (a file written before the end is partial)."""
    if umbrella in {"NoIssuesFound", "IssuesFound"}:
        return "IssuesFound" if report.rule_triggered else "NoIssuesFound"
    return umbrella


def _result(
    name: str,
    status: RuleStatus,
    report: DebuggerRuleReport | None,
    *,
    parameters: dict[str, str],
    detail: str | None,
    report_uri: str,
) -> RuleResult:
    if report is None:
        # A rule job stops at the first time its condition holds (RuleEvaluationConditionMet).
        trigger_count = 1 if status == "IssuesFound" else 0
        return RuleResult(
            name=name,
            status=status,
            trigger_count=trigger_count,
            parameters=parameters,
            recommendation=_recommendation(name, status),
            detail=detail,
            source="debugger",
            report_uri=report_uri,
        )
    return RuleResult(
        name=name,
        status=status,
        trigger_count=report.rule_triggered,
        violations=report.violations,
        datapoints=report.datapoints,
        evidence=_compact(report.details),
        parameters=parameters or report.parameters,
        recommendation=_recommendation(name, status),
        detail=detail,
        source="debugger",
        report_uri=report_uri,
    )


def _recommendation(name: str, status: RuleStatus) -> str:
    if status == "IssuesFound":
        return RECOMMENDATIONS.get(name, "See the rule's report.")
    return _BY_STATUS.get(status, "")


def _compact(details: dict[str, Any]) -> dict[str, Any]:
    compacted = _cut(details)
    assert isinstance(compacted, dict)
    return compacted


def _cut(value: Any) -> Any:
    """The same JSON with every list and map cut to `EVIDENCE_ITEMS` entries (plus a count)."""
    if isinstance(value, dict):
        items = list(value.items())
        kept = {str(key): _cut(item) for key, item in items[:EVIDENCE_ITEMS]}
        if len(items) > EVIDENCE_ITEMS:
            kept["omitted_entries"] = len(items) - EVIDENCE_ITEMS
        return kept
    if isinstance(value, list):
        kept_items = [_cut(item) for item in value[:EVIDENCE_ITEMS]]
        if len(value) > EVIDENCE_ITEMS:
            kept_items.append(f"... {len(value) - EVIDENCE_ITEMS} more")
        return kept_items
    return value
