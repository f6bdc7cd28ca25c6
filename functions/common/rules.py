"""`rules.json`: the profiler rule verdicts of one training run, whichever back end produced them.

Two back ends write this file (docs/profiling.md; docs/architecture.md, "Three things called rule"):

- `builtin`: the trainer evaluates Debugger's rule definitions on its own samples and writes
  `rules.json` with its output (it imports nothing from here: it writes plain JSON, and a test
  validates real trainer output against these models);
- `debugger`: `functions.common.debugger` builds it from DescribeTrainingJob and the report
  files SageMaker Debugger writes under `rule-output/`.

Notifications and the quality gate read only this model, so they never need to know which back
end ran. No torch here: Lambdas import this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

# Debugger's RuleEvaluationStatus values. The built-in back end uses only the three final ones;
# Debugger's rule jobs can still be InProgress (or Stopping) after the training job has ended.
RuleStatus = Literal["NoIssuesFound", "IssuesFound", "Error", "InProgress", "Stopping", "Stopped"]
PENDING_STATUSES: frozenset[str] = frozenset({"InProgress", "Stopping"})

RuleSource = Literal["builtin", "debugger"]


class RuleResult(BaseModel):
    """One rule's verdict, with what it saw and what to do about it."""

    model_config = ConfigDict(extra="forbid")

    # Debugger's rule name (`LowGPUUtilization`, `CPUBottleneck`, ...): both back ends use them.
    name: str = Field(min_length=1)
    status: RuleStatus
    # Whether the rule could judge this run. False: it had no input here (no GPU metrics on a CPU
    # host, one GPU for LoadBalancing, too few steps, no losses); the status then stays Debugger's
    # NoIssuesFound, which is no pass. Files written before this field (and Debugger's results,
    # which do not say) parse as applicable.
    applicable: bool = True
    not_applicable_reason: str | None = None
    # How many times the rule's condition held (Debugger's `RuleTriggered`); 0 when it never did.
    trigger_count: int = Field(default=0, ge=0)
    # Datapoints that broke the condition, and datapoints examined (Debugger's `Violations`,
    # `Datapoints`), when the back end counts them.
    violations: int | None = Field(default=None, ge=0)
    datapoints: int | None = Field(default=None, ge=0)
    # What the rule saw, keyed the way the rule thinks: hosts (`algo-1`), ranks, GPUs (`gpu0`),
    # step numbers, percentiles. Free-form JSON, kept small (long lists are cut, with a count).
    evidence: dict[str, Any] = Field(default_factory=dict)
    # The parameters the rule ran with (thresholds, patience, window), as strings.
    parameters: dict[str, str] = Field(default_factory=dict)
    # Plain words for the engineer reading the notification: what it means, what to try.
    recommendation: str = ""
    # Why the status is what it is when it is not a verdict (an Error's message, say).
    detail: str | None = None
    source: RuleSource
    # Where the rule's report is (an s3:// URI); links in notifications are made from it.
    report_uri: str | None = None

    @property
    def pending(self) -> bool:
        return self.status in PENDING_STATUSES

    @property
    def passed(self) -> bool:
        """NoIssuesFound on a rule that judged: a pass (a rule with nothing to judge is none)."""
        return self.status == "NoIssuesFound" and self.applicable


class RulesFile(BaseModel):
    """`rules.json`: every rule of one run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    backend: RuleSource
    job_name: str | None = None
    generated_at: datetime
    # The HTML report of the whole run (s3:// URI), when there is one.
    report_uri: str | None = None
    rules: list[RuleResult] = Field(default_factory=list)

    @property
    def pending(self) -> list[str]:
        """Names of the rules still being evaluated: wait before reporting on the run."""
        return [rule.name for rule in self.rules if rule.pending]

    @property
    def issues(self) -> list[RuleResult]:
        return [rule for rule in self.rules if rule.status == "IssuesFound"]

    @property
    def not_applicable(self) -> list[RuleResult]:
        """The rules that had nothing to judge on this run's hosts."""
        return [rule for rule in self.rules if not rule.applicable]


def parse_rules_file(text: str | bytes) -> RulesFile:
    """A `rules.json` document, validated."""
    return RulesFile.model_validate_json(text)


# ----------------------------------------------------------------------------- in words --
# How every reader is told about a rule, in one place: the notification (e-mail and Slack), the
# offline demo's table and `retrain report`'s summary line. (The trainer's HTML report shows the
# same classes; the trainer imports nothing from functions/, and tests/unit/test_rule_words.py
# checks that it agrees.)
ISSUES, ERROR, PENDING, NOT_APPLICABLE, PASSED = (
    "issues found",
    "could not judge",
    "still evaluating",
    "not applicable",
    "no issues",
)


class RuleLike(Protocol):
    """What the words need: a `RuleResult`, or a summary's `RuleVerdict`."""

    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def applicable(self) -> bool: ...
    @property
    def not_applicable_reason(self) -> str | None: ...
    @property
    def recommendation(self) -> str: ...
    @property
    def detail(self) -> str | None: ...


def verdict(rule: RuleLike) -> str:
    """The rule's verdict in words. NoIssuesFound on a rule with nothing to judge is no pass."""
    if rule.status == "IssuesFound":
        return ISSUES
    if rule.status == "Error":
        return ERROR
    if rule.status in PENDING_STATUSES:
        return PENDING
    if not rule.applicable:
        return NOT_APPLICABLE
    return PASSED


def advice(rule: RuleLike) -> str:
    """What the reader should take from it: what to do, why it could not judge, or nothing."""
    found = verdict(rule)
    if found == ISSUES:
        return rule.recommendation or rule.detail or "see the profiling report"
    if found == NOT_APPLICABLE:
        return rule.not_applicable_reason or rule.detail or "nothing to judge"
    if found == ERROR:
        return rule.detail or "the rule failed"
    return ""


def summary_line(rules: Sequence[RuleLike], backend: str | None) -> str | None:
    """The rules with nothing to act on, in one line: "10 of 12 rules found nothing to report;
    GPUMemoryIncrease, LowGPUUtilization not applicable on this host: no GPU"."""
    if not rules:
        return None
    by_verdict: dict[str, list[RuleLike]] = {}
    for rule in rules:
        by_verdict.setdefault(verdict(rule), []).append(rule)
    grouped: dict[str, list[str]] = {}
    for rule in by_verdict.get(NOT_APPLICABLE, []):
        grouped.setdefault(advice(rule), []).append(rule.name)
    parts = [f"{len(by_verdict.get(PASSED, []))} of {len(rules)} rules found nothing to report"]
    parts += [f"{', '.join(names)} not applicable on this host: {reason}" for reason, names in grouped.items()]
    if by_verdict.get(ERROR):
        parts.append(f"could not judge: {', '.join(rule.name for rule in by_verdict[ERROR])}")
    if by_verdict.get(PENDING):
        parts.append(f"still evaluating: {', '.join(rule.name for rule in by_verdict[PENDING])}")
    return f"Profiler rules ({backend}): " + "; ".join(parts)
