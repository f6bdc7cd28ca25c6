"""Every reader is told about a rule in the same words (functions/common/rules.py): the
notification, the offline demo and `retrain report`; the trainer's HTML report agrees."""

from __future__ import annotations

from pathlib import Path

from functions.common import rules
from functions.common.rules import RuleResult
from trainer.profiling.report import render_html
from trainer.profiling.rules import ProfileData, RuleEvaluation


def _rule(name: str, status: str, **fields: object) -> RuleResult:
    return RuleResult.model_validate({"name": name, "status": status, "source": "builtin", **fields})


RULES = [
    _rule("DataStall", "IssuesFound", recommendation="add loader workers"),
    _rule("CPUBottleneck", "NoIssuesFound"),
    _rule("LowGPUUtilization", "NoIssuesFound", applicable=False, not_applicable_reason="no GPU on this host"),
    _rule("GPUMemoryIncrease", "NoIssuesFound", applicable=False, not_applicable_reason="no GPU on this host"),
    _rule("StepOutlier", "Error", detail="too few steps"),
    _rule("ProfilerReport", "InProgress"),
]


def test_each_rule_gets_one_verdict_and_its_advice() -> None:
    assert [rules.verdict(rule) for rule in RULES] == [
        "issues found",
        "no issues",
        "not applicable",
        "not applicable",
        "could not judge",
        "still evaluating",
    ]
    assert [rules.advice(rule) for rule in RULES[:3]] == ["add loader workers", "", "no GPU on this host"]


def test_the_quiet_rules_are_said_in_one_line() -> None:
    assert rules.summary_line(RULES, "builtin") == (
        "Profiler rules (builtin): 1 of 6 rules found nothing to report; LowGPUUtilization, "
        "GPUMemoryIncrease not applicable on this host: no GPU on this host; could not judge: StepOutlier; "
        "still evaluating: ProfilerReport"
    )
    assert rules.summary_line([], "builtin") is None


def test_the_trainers_html_report_says_not_applicable_the_same_way(tmp_path: Path) -> None:
    data = ProfileData.read(tmp_path)
    results = [
        RuleEvaluation("DataStall", "IssuesFound", recommendation="add loader workers"),
        RuleEvaluation("LowGPUUtilization", "NoIssuesFound").not_applicable("no GPU on this host"),
    ]
    page = render_html(data, results)
    assert f"{rules.NOT_APPLICABLE} on this host: no GPU on this host" in page
    assert "add loader workers" in page
