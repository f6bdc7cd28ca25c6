"""A run summary in words: the e-mail subject and body the team receives over SNS."""

from __future__ import annotations

from functions.common.summary import RunSummary

SUBJECT_LIMIT = 100  # SNS refuses longer subjects
CAUSE_LINES = 8

_HEADLINES = {
    "accepted": "Retraining accepted",
    "rejected": "Retraining rejected by the quality gate",
    "failed": "Retraining failed",
    "stopped": "Retraining stopped",
}


def subject(summary: RunSummary) -> str:
    headline = _HEADLINES[summary.outcome]
    if summary.outcome in {"accepted", "rejected"} and summary.miou is not None:
        change = summary.gate.miou_change if summary.gate else None
        delta = f" ({change:+.3f})" if change is not None else ""
        headline = f"{headline}: mIoU {summary.miou:.3f}{delta}"
    elif summary.failed_state:
        headline = f"{headline} at {summary.failed_state}"
    text = f"{headline} - {summary.dataset_version}"
    return text if len(text) <= SUBJECT_LIMIT else text[: SUBJECT_LIMIT - 3] + "..."


def body(summary: RunSummary) -> str:
    lines = [f"{_HEADLINES[summary.outcome]}.", ""]
    lines.append(f"Run:              {summary.run}")
    lines.append(f"Dataset version:  {summary.dataset_version} ({summary.pair_count} pairs)")
    if summary.duration_seconds is not None:
        lines.append(f"Duration:         {_duration(summary.duration_seconds)}")
    if summary.job is not None:
        job = summary.job
        lines.append(f"Training job:     {job.name} ({job.instance_count} x {job.instance_type})")
    if summary.miou is not None:
        lines.append(f"mIoU:             {summary.miou:.3f}")
    if summary.gate is not None:
        lines += ["", "Quality gate: " + ("accepted" if summary.gate.accepted else "rejected")]
        lines += [f"  - {reason}" for reason in summary.gate.reasons]
        if summary.gate.worse_classes:
            worse = ", ".join(f"{name} {delta:+.3f}" for name, delta in summary.gate.worse_classes.items())
            lines.append(f"  Classes that got worse: {worse}")
    issues = [rule for rule in summary.rules if rule.status == "IssuesFound"]
    if summary.rules:
        lines += [
            "",
            f"Profiler rules ({summary.rules_backend}): {len(issues)} of {len(summary.rules)} found issues",
        ]
        lines += [f"  - {rule.name}: {rule.recommendation}" for rule in issues]
    if summary.error is not None:
        lines += ["", f"Failed at:  {summary.failed_state}", f"Error:      {summary.error}"]
        cause = (summary.cause or "").strip().splitlines()[:CAUSE_LINES]
        lines += ["Cause:", *[f"  {line}" for line in cause]]
    artifacts = summary.artifacts
    lines += ["", f"Run summary:      {artifacts.summary}"]
    if artifacts.report:
        lines.append(f"Profiling report: {artifacts.report}")
    if artifacts.model:
        lines.append(f"Model:            {artifacts.model}")
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"
