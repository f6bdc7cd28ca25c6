"""`rules.json`: the profiler rule verdicts of one training run, whichever back end produced them.

Two back ends write this file (DESIGN.md section 6):

- `builtin`: the trainer evaluates Debugger's rule definitions on its own samples and writes
  `rules.json` with its output (it imports nothing from here: it writes plain JSON, and a test
  validates real trainer output against these models);
- `debugger`: `functions.training_job.debugger` builds it from DescribeTrainingJob and the report
  files SageMaker Debugger writes under `rule-output/`.

Notifications and the quality gate read only this model, so they never need to know which back
end ran. No torch here: Lambdas import this module.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

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
