"""Tell the team how a run went: from its summary, or, for a failure, from what got that far.

A failed or stopped run gets a `summary.json` of its own here (the failure branch has no
EvaluateRun), so every run, whatever its end, leaves one under `reports/runs/<run>/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from functions.common import prefixes
from functions.common.models import RunState
from functions.common.summary import RunArtifacts, RunSummary
from functions.data.storage import DataBucket
from functions.notify import render

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sns import SNSClient

STOPPED_ERRORS = frozenset({"TrainingJobStoppedError"})


class NotifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: Literal["finished", "failed"]
    execution: str  # $$.Execution.Name
    summary_uri: str | None = None  # finished: EvaluateRun's summary
    state: RunState | None = None  # failed: the whole state


class Notified(BaseModel):
    outcome: str
    subject: str
    summary_uri: str
    message_id: str


@dataclass(frozen=True)
class Notifier:
    s3: S3Client
    sns: SNSClient
    bucket: str
    topic_arn: str

    def notify(self, request: NotifyRequest, now: datetime | None = None) -> Notified:
        if request.kind == "finished" and request.summary_uri is not None:
            summary = self._read(request.summary_uri)
        else:
            summary = self._failure_summary(request, now or datetime.now(UTC))
        subject = render.subject(summary)
        message_id = self.sns.publish(
            TopicArn=self.topic_arn,
            Subject=subject,
            Message=render.body(summary),
            MessageAttributes={
                "outcome": {"DataType": "String", "StringValue": summary.outcome},
                "dataset_version": {"DataType": "String", "StringValue": summary.dataset_version},
            },
        )["MessageId"]
        return Notified(
            outcome=summary.outcome,
            subject=subject,
            summary_uri=summary.artifacts.summary,
            message_id=message_id,
        )

    def _read(self, uri: str) -> RunSummary:
        bucket, key = prefixes.split_s3_uri(uri)
        return RunSummary.model_validate_json(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def _failure_summary(self, request: NotifyRequest, now: datetime) -> RunSummary:
        state = request.state or RunState()
        failure = state.failure
        run = state.run
        name = run.run if run is not None and run.run else request.execution
        key = prefixes.run_report_key(name, "summary.json")
        summary = RunSummary(
            run=name,
            outcome="stopped" if failure.error in STOPPED_ERRORS else "failed",
            dataset_version=(run.dataset_version if run else state.dataset_version) or "unknown",
            pair_count=run.pair_count if run else None,
            started_at=run.started_at if run else None,
            finished_at=now,
            duration_seconds=(now - run.started_at).total_seconds() if run and run.started_at else None,
            baseline_run=run.accepted.run if run and run.accepted else None,
            artifacts=RunArtifacts(
                folder=f"s3://{self.bucket}/{prefixes.run_report_key(name, '')}",
                summary=f"s3://{self.bucket}/{key}",
            ),
            failed_state=failure.state,
            error=failure.error,
            cause=failure.message,
        )
        DataBucket(self.s3, self.bucket).put_text(key, summary.model_dump_json(indent=2), "application/json")
        return summary
