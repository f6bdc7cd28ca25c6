"""SageMaker Debugger's profiler rules, played for a job whose request asks for them.

On AWS, Debugger samples every training host from outside the training script and runs each
configured rule as a processing job that outlives the training job. Here:

- the system monitor is the trainer's own sampler (`trainer/profiling/monitor.py`), run by the
  emulator beside each host's processes and writing to `<host>/debugger/profile/` (never into
  `output/data`, which is the job's own output);
- after the job, each rule configuration is evaluated with `trainer/profiling/rules/` and its
  `RuleParameters` (`rule_to_invoke`; for ProfilerReport, `<Rule>_<parameter>` overrides), the
  files ProfilerReport writes are written (`profiler-reports/<Rule>.json`, the shape
  `functions.common.debugger.DebuggerRuleReport` reads, and `profiler-report.html`);
- `ProfilerRuleEvaluationStatuses` say InProgress until `delay` seconds after the job ended,
  then the verdicts; a stopped job's rules end Stopped.

Deviations: the trainer's sampler has no framework profiler, so no step timelines reach the rules
(StepOutlier sees no steps, MaxInitializationTime counts to the end of the job); emulated hosts
share this machine, so each one's samples describe the same CPUs and GPUs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from trainer.profiling import monitor, report, rules

log = logging.getLogger(__name__)

PROFILER_REPORT = "ProfilerReport"
# The rules ProfilerReport runs (smdebug's ProfilerReport), each writing its own report file.
PROFILER_REPORT_RULES = (
    "BatchSize",
    "CPUBottleneck",
    "Dataloader",
    "GPUMemoryIncrease",
    "IOBottleneck",
    "LoadBalancing",
    "LowGPUUtilization",
    "MaxInitializationTime",
    "OverallSystemUsage",
    "StepOutlier",
)
NO_DATA = "ClientError: No profiler data was found under the ProfilerConfig S3OutputPath; the rule evaluation stopped"
REPORTS_FOLDER = f"{PROFILER_REPORT}/profiler-output/profiler-reports"
REPORT_PAGE = f"{PROFILER_REPORT}/profiler-output/profiler-report.html"
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9]+")

Verdict = tuple[str, str | None]  # (RuleEvaluationStatus, StatusDetails)


def processing_job_arn(region: str, account_id: str, job_name: str, configuration: str) -> str:
    """The rule job's ARN, named as SageMaker names them (`<job>-<rule>-<8 hex>`, 63 at most)."""
    digest = hashlib.sha256(f"{job_name}/{configuration}".encode()).hexdigest()[:8]
    rule = _NOT_IN_NAME.sub("-", configuration.lower()).strip("-")[:16] or "rule"
    name = f"{job_name[:26]}-{rule}-{digest}"
    return f"arn:aws:sagemaker:{region}:{account_id}:processing-job/{name}"


def condition_met(name: str) -> str:
    return f"RuleEvaluationConditionMet: Evaluation of the rule {name} at step 0 resulted in the condition being met\n"


class RuleEvaluations:
    """The rule jobs of one training job, as `ProfilerRuleEvaluationStatuses` reports them."""

    def __init__(
        self,
        configurations: Sequence[Mapping[str, Any]],
        *,
        job_name: str,
        region: str,
        account_id: str,
        created: datetime,
        delay_seconds: float,
    ) -> None:
        self.names = [str(item["RuleConfigurationName"]) for item in configurations]
        self._arns = {name: processing_job_arn(region, account_id, job_name, name) for name in self.names}
        self._created = created
        self._delay = timedelta(seconds=delay_seconds)
        self._verdicts: dict[str, Verdict] | None = None
        self._evaluated_at: datetime | None = None
        self._lock = threading.Lock()

    def publish(self, verdicts: Mapping[str, Verdict], at: datetime) -> None:
        with self._lock:
            self._verdicts, self._evaluated_at = dict(verdicts), at

    def statuses(self, *, at: datetime, job_status: str, ended: datetime | None) -> list[dict[str, Any]]:
        with self._lock:
            verdicts, evaluated_at = self._verdicts, self._evaluated_at
        final_at = ended + self._delay if ended is not None else None
        answer = []
        for name in self.names:
            status, details, modified = "InProgress", None, self._created
            if job_status in {"Stopping", "Stopped"}:
                done = job_status == "Stopped" and final_at is not None and at >= final_at
                status = "Stopped" if done else "Stopping"
                modified = final_at if done and final_at is not None else (ended or self._created)
            elif final_at is not None and verdicts is not None and at >= final_at:
                status, details = verdicts.get(name, ("Error", "InternalServerError: no verdict"))
                modified = max(final_at, evaluated_at or final_at)
            item: dict[str, Any] = {
                "RuleConfigurationName": name,
                "RuleEvaluationJobArn": self._arns[name],
                "RuleEvaluationStatus": status,
                "LastModifiedTime": modified,
            }
            if details:
                item["StatusDetails"] = details[:1024]
            answer.append(item)
        return answer


class SystemMonitors:
    """Debugger's system monitor on every host: one sampler each, outside the training script."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self._monitors: list[monitor.SystemMonitor] = []
        self._lock = threading.Lock()

    def start(self, folder: Path, host: str, launcher_pid: int) -> None:
        sampler = monitor.SystemMonitor(
            folder / "profile", node=host, interval_ms=self.interval_ms, pids=[launcher_pid]
        )
        with self._lock:
            self._monitors.append(sampler.start())

    def stop(self) -> None:
        with self._lock:
            monitors, self._monitors = self._monitors, []
        for sampler in monitors:
            sampler.stop()


def _value(text: str) -> Any:
    """A RuleParameters value (always a string in the API) as the rule code takes it."""
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def rule_parameters(raw: Mapping[str, str]) -> dict[str, Any]:
    """Debugger's parameter names for one rule -> the trainer's (scan_interval_us is in µs)."""
    values: dict[str, Any] = {}
    for name, text in raw.items():
        if name == "scan_interval_us":
            values["scan_interval_s"] = float(text) / 1e6
        else:
            values[name] = _value(text)
    return values


def _evaluate(name: str, parameters: Mapping[str, Any], data: rules.ProfileData) -> rules.RuleEvaluation:
    overrides = {name: dict(parameters)}
    try:
        rules.parameters_for(name, overrides)
    except ValueError as error:
        return rules.RuleEvaluation(name, rules.STATUS_ERROR, detail=f"ClientError: {error}")
    [result] = rules.evaluate(data, overrides, names=[name])
    return result


def report_file(result: rules.RuleEvaluation) -> dict[str, Any]:
    """`profiler-reports/<Rule>.json` as smdebug's rules fill their report."""
    document = result.to_dict()
    return {
        "RuleTriggered": result.trigger_count,
        "Violations": result.violations or 0,
        "Details": document["evidence"],
        "Datapoints": result.datapoints or 0,
        "RuleParameters": "\n".join(f"{key}:{value}" for key, value in result.parameters.items()),
    }


def _verdict(result: rules.RuleEvaluation) -> Verdict:
    if result.status == rules.STATUS_ISSUES:
        return result.status, condition_met(result.name)
    if result.status == rules.STATUS_ERROR:
        detail = result.detail or "the rule failed"
        prefix = "" if detail.startswith("ClientError: ") else "AlgorithmError: "
        return result.status, f"{prefix}{detail}"
    return result.status, None


def load_profile(folders: Sequence[Path], *, started: float, ended: float) -> rules.ProfileData:
    """What every host's monitor wrote, as the rules read it (the monitors write no steps)."""
    return rules.ProfileData.read(*(folder / "profile" for folder in folders), started_at=started, now=ended)


def evaluate_rules(
    configurations: Sequence[Mapping[str, Any]],
    data: rules.ProfileData,
    out_dir: Path,
    *,
    job_name: str,
    metrics: Mapping[str, Any] | None = None,
) -> dict[str, Verdict]:
    """Every rule configuration's verdict; ProfilerReport's files under `out_dir` (the job's
    `rule-output/` folder)."""
    verdicts: dict[str, Verdict] = {}
    for configuration in configurations:
        name = str(configuration["RuleConfigurationName"])
        raw = dict(configuration.get("RuleParameters", {}))
        rule = raw.pop("rule_to_invoke", name)
        if not data.system:
            verdicts[name] = ("Error", NO_DATA)
        elif rule == PROFILER_REPORT:
            verdicts[name] = _profiler_report(name, raw, data, out_dir, job_name=job_name, metrics=metrics)
        elif rule in rules.RULES:
            verdicts[name] = _verdict(_evaluate(rule, rule_parameters(raw), data))
        else:
            verdicts[name] = ("Error", f"ClientError: {rule!r} is not a built-in profiler rule")
        log.info("rule %s of %s: %s", name, job_name, verdicts[name][0])
    return verdicts


def _profiler_report(
    name: str,
    raw: Mapping[str, str],
    data: rules.ProfileData,
    out_dir: Path,
    *,
    job_name: str,
    metrics: Mapping[str, Any] | None,
) -> Verdict:
    """ProfilerReport: every rule it runs, with `<Rule>_<parameter>` overrides, one file each."""
    overrides: dict[str, dict[str, str]] = {}
    for key, value in raw.items():
        rule, _, parameter = key.partition("_")
        if rule not in PROFILER_REPORT_RULES or not parameter:
            return "Error", f"ClientError: ProfilerReport has no parameter {key!r}"
        overrides.setdefault(rule, {})[parameter] = value
    results = [_evaluate(rule, rule_parameters(overrides.get(rule, {})), data) for rule in PROFILER_REPORT_RULES]
    folder = out_dir / REPORTS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for result in results:
        if result.status != rules.STATUS_ERROR:
            text = json.dumps(report_file(result), indent=2)
            (folder / f"{result.name}.json").write_text(text, encoding="utf-8")
    page = report.render_html(data, results, job_name=job_name, metrics=metrics)
    (out_dir / REPORT_PAGE).write_text(page, encoding="utf-8")
    if any(result.status == rules.STATUS_ISSUES for result in results):
        return rules.STATUS_ISSUES, condition_met(name)
    return rules.STATUS_OK, None
