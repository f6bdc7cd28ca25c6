"""`reports/runs/<run>/summary.json`: what one retraining run did, in one model.

EvaluateRun writes it for a run whose job completed (accepted or rejected by the quality gate);
the failure branch writes it for a run that failed or was stopped. Notifications, `retrain runs`
and people read it; the files it points to hold the detail.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from functions.common.contracts import BatchScores, ScreeningSummary
from functions.common.rules import RuleStatus

# "running": the optional message when a run starts; the others end a run.
RunOutcome = Literal["running", "accepted", "rejected", "failed", "stopped"]


class GateVerdict(BaseModel):
    """The quality gate's decision, with the numbers it was made on."""

    accepted: bool
    reasons: list[str]  # plain sentences: why accepted, or each reason for rejecting
    miou: float | None
    baseline_miou: float | None = None  # the accepted model, scored in the same job
    miou_change: float | None = None
    # Classes whose IoU fell against the accepted model, by how much (negative numbers).
    worse_classes: dict[str, float] = Field(default_factory=dict)
    miou_tolerance: float
    class_tolerance: float
    # Which pairs the two models were compared on, and how many ("both scored on 40 trusted ...").
    compared_on: str | None = None
    # How many trusted (and benchmark) validation pairs that was; None: not a trusted set.
    trusted_pairs: int | None = None
    # The gate let the model through, but models/accepted.json named another run when this one
    # went to accept it (that run; "" when the file had been removed): not accepted, and not the
    # gate's doing, so the message does not say the gate rejected it.
    accepted_meanwhile: str | None = None


class JobSummary(BaseModel):
    name: str
    arn: str | None = None
    status: str | None = None
    instance_type: str | None = None
    instance_count: int | None = None
    distribution: str | None = None
    profiling: str | None = None
    training_seconds: int | None = None
    billable_seconds: int | None = None
    spot: bool = False


class RuleVerdict(BaseModel):
    """One profiler rule, as a person reads it in a summary (the detail is in rules.json)."""

    name: str
    status: RuleStatus
    trigger_count: int = 0
    recommendation: str = ""
    detail: str | None = None
    # False: the rule had nothing to judge on this run's hosts (`RuleResult.applicable`).
    applicable: bool = True
    not_applicable_reason: str | None = None


class RunArtifacts(BaseModel):
    """Where everything of the run is (s3:// URIs)."""

    folder: str  # reports/runs/<run>/ (reports/failures/<run>/: a run that ended before its evaluation)
    summary: str
    metrics: str | None = None
    rules: str | None = None
    report: str | None = None  # the profiling report (HTML)
    model: str | None = None  # SageMaker's model.tar.gz
    model_version_id: str | None = None
    sealed_model: str | None = None  # models/packages/<run>/model.tar.gz: what the package names (accepted runs)
    model_sha256: str | None = None  # the sealed copy's SHA-256, as the package records it
    output: str | None = None  # SageMaker's output.tar.gz
    weights: str | None = None  # models/runs/<run>/model.pt (accepted runs)
    screening: str | None = None  # screening.json: what the accepted model found in the new batches


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = 1
    run: str
    outcome: RunOutcome
    dataset_version: str
    execution_arn: str | None = None
    pair_count: int | None = None
    new_pairs: int | None = None  # pairs the accepted model was not trained on
    new_batches: list[str] = Field(default_factory=list)  # the batches they came in
    started_at: datetime | None = None
    finished_at: datetime
    duration_seconds: float | None = None
    job: JobSummary | None = None
    miou: float | None = None
    per_class_iou: dict[str, float | None] = Field(default_factory=dict)
    train_images: int | None = None
    val_images: int | None = None
    epochs: int | None = None
    # The accepted model this run was compared with (None: the first run).
    baseline_run: str | None = None
    # sha256 of the released sourcedir.tar.gz the run started with, checked before its job was
    # created (code/<sha256>/sourcedir.tar.gz; None for runs before releases were checked). Not
    # metrics.json's code_sha256: that is the trainer's own digest of its sources, as it reports it.
    code_archive_sha256: str | None = None
    gate: GateVerdict | None = None
    rules_backend: Literal["builtin", "debugger"] | None = None
    rules: list[RuleVerdict] = Field(default_factory=list)
    artifacts: RunArtifacts
    model_package_arn: str | None = None
    # Data trust (issue 26): what screening said, each batch's scores, what became held or trusted.
    screening: ScreeningSummary | None = None
    batch_scores: dict[str, BatchScores] = Field(default_factory=dict)
    held: dict[str, list[str]] = Field(default_factory=dict)  # batch -> why, held whole by this run
    left_out: dict[str, int] = Field(default_factory=dict)  # batch -> its pairs left out for its team to fix
    disputed: dict[str, list[str]] = Field(default_factory=dict)  # batch -> why: the operator decides
    not_judged: list[str] = Field(default_factory=list)  # trained on, not trusted, screened again next time
    newly_trusted: list[str] = Field(default_factory=list)  # batches with pairs that earned trust
    trusted_pairs: dict[str, int] = Field(default_factory=dict)  # batch -> its pairs that earned trust
    # For failed and stopped runs: where and why.
    failed_state: str | None = None
    error: str | None = None
    cause: str | None = None
