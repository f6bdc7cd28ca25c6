"""Tell the team how a run went, by e-mail (SNS) and in Slack, from one summary.

A failed or stopped run gets a `summary.json` of its own here (the failure branch has no
EvaluateRun), so every run, whatever its end, leaves one: an evaluated run under
`reports/runs/<run>/`, which only EvaluateRun may write (it is the evidence behind a model), and
one that ended before its evaluation under `reports/failures/<run>/`. Slack is
best effort: no webhook configured, a secret that cannot be read or holds no webhook URL
(`secret.py`), or Slack being down skips or fails the Slack message with one log line, never the
run and never the SNS message.

A run end's message (finished or failed) is sent once per run end, however often it is asked
for, when the notifier is given the ledger's run-end records (`once`, `functions/notify/once.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pydantic import BaseModel

from functions.common import prefixes
from functions.common.models import RunContext, RunState
from functions.common.requests import NotifyRequest
from functions.common.summary import RunArtifacts, RunSummary
from functions.data.storage import DataBucket
from functions.notify import render, slack
from functions.notify.history import failed_state
from functions.notify.links import RunLinks, presign_report, run_links
from functions.notify.once import OneMessage
from functions.notify.secret import SlackSecretError
from functions.notify.slack import SlackOutcome

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_stepfunctions import SFNClient
    from mypy_boto3_sts import STSClient

# Stopped on purpose, not failed: the job stopped, `retrain runs cancel` (RunCancelled), or a
# StopExecution with no error of its own (RunEndedFunction calls that States.Aborted).
STOPPED_ERRORS = frozenset({"TrainingJobStoppedError", "RunCancelled", "States.Aborted"})
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
SLACK_WEBHOOK_HOST = "hooks.slack.com"


class Notified(BaseModel):
    # False: the message about this run's end had been sent already (by whoever claimed it
    # first), and nothing was sent or written now.
    sent: bool = True
    outcome: str | None = None
    subject: str | None = None
    summary_uri: str | None = None
    message_id: str | None = None
    slack: SlackOutcome | None = None
    reason: str | None = None  # why nothing was sent


def usable_webhook(url: str | None) -> str | None:
    """Why a webhook URL cannot be used (None: it can): https on Slack's webhook host, or http on
    loopback (the offline stack's stand-in for Slack).

    Only Slack's host, because the message carries presigned report links and the run's results:
    whoever can change the secret must not be able to send them to a host of their choosing. The
    reason never quotes the URL (it is a credential)."""
    if not url:
        return "no Slack webhook is configured (the secret holds no URL yet)"
    parsed = urlparse(url)
    if parsed.scheme == "http" and parsed.hostname in LOOPBACK:
        return None
    if parsed.scheme != "https" or not parsed.hostname:
        return "the secret's webhook URL is not an https URL"
    try:
        port = parsed.port
    except ValueError:
        port = -1  # not a port at all
    if parsed.hostname != SLACK_WEBHOOK_HOST or parsed.username is not None or port not in {None, 443}:
        return (
            f"the secret's webhook URL is not on Slack's webhook host {SLACK_WEBHOOK_HOST}: nothing is sent "
            "elsewhere; store the channel's incoming-webhook URL (https://hooks.slack.com/services/...)"
        )
    return None


@dataclass(frozen=True)
class Notifier:
    s3: S3Client
    sns: SNSClient
    sts: STSClient
    bucket: str
    topic_arn: str
    region: str
    report_reader_role_arn: str
    webhook: Callable[[], str | None]  # the Slack webhook URL, read when a message is sent
    # Which state failed, from the execution's history: the failure branch does not write it into
    # the state (`retrain runs cancel` and RunEndedFunction do, and need no client).
    sfn: SFNClient | None = None
    # The run-end records, through which a run end's message is sent once (None: every request
    # is sent, as by a notifier that no run's end is recorded for).
    once: OneMessage | None = None

    def notify(self, request: NotifyRequest, now: datetime | None = None) -> Notified:
        """Tell the team; a run end's message only if nobody has yet (`functions/notify/once.py`)."""
        if self.once is None or request.kind == "started":
            return self._notify(request, now)
        sent = self.once.send(request.execution, lambda: self._notify(request, now), lambda n: n.message_id)
        if isinstance(sent, Notified):
            return sent
        return Notified(
            sent=False,
            message_id=sent.message_id,
            reason=f"the message about this run's end was sent already, at {sent.sent_at}: nothing sent now",
        )

    def _notify(self, request: NotifyRequest, now: datetime | None = None) -> Notified:
        now = now or datetime.now(UTC)
        if request.kind == "finished" and request.summary_uri is not None:
            summary = self._read(request.summary_uri)
        elif request.kind == "started" and request.run is not None:
            summary = self._started_summary(request, request.run, now)
        else:
            summary = self._failure_summary(request, now)
        message = render.render(summary, self._links(summary, now))
        message_id = self.sns.publish(
            TopicArn=self.topic_arn,
            Subject=message.subject,
            Message=message.text,
            MessageAttributes={
                "outcome": {"DataType": "String", "StringValue": summary.outcome},
                "dataset_version": {"DataType": "String", "StringValue": summary.dataset_version},
            },
        )["MessageId"]
        return Notified(
            outcome=summary.outcome,
            subject=message.subject,
            summary_uri=summary.artifacts.summary if summary.outcome != "running" else None,
            message_id=message_id,
            slack=self._slack(message.slack),
        )

    # ------------------------------------------------------------ channels --
    def _slack(self, message: dict[str, object]) -> slack.SlackOutcome:
        try:
            url = self.webhook()
        except SlackSecretError as error:
            return slack.SlackOutcome(delivered=False, skipped=str(error))  # what it must hold, not what it holds
        except Exception as error:
            return slack.SlackOutcome(
                delivered=False, skipped=f"the Slack secret cannot be read: {type(error).__name__}"
            )
        problem = usable_webhook(url)
        if problem is not None or url is None:
            return slack.SlackOutcome(delivered=False, skipped=problem)
        return slack.post(url, message)

    def _links(self, summary: RunSummary, now: datetime) -> RunLinks:
        report_key = None
        report = None
        if summary.artifacts.report is not None:
            bucket, report_key = prefixes.split_s3_uri(summary.artifacts.report)
            if self.report_reader_role_arn:
                report = presign_report(
                    sts=self.sts,
                    role_arn=self.report_reader_role_arn,
                    run=summary.run,
                    bucket=bucket,
                    key=report_key,
                    now=now,
                )
        return run_links(
            region=self.region,
            bucket=self.bucket,
            folder=prefixes.split_s3_uri(summary.artifacts.folder)[1],
            job_name=summary.job.name if summary.job else None,
            execution_arn=summary.execution_arn,
            report_key=report_key,
            batches=summary.new_batches,
            report=report,
        )

    # ----------------------------------------------------------- summaries --
    def _read(self, uri: str) -> RunSummary:
        bucket, key = prefixes.split_s3_uri(uri)
        return RunSummary.model_validate_json(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def _artifacts(self, folder: str) -> RunArtifacts:
        return RunArtifacts(folder=f"s3://{self.bucket}/{folder}", summary=f"s3://{self.bucket}/{folder}summary.json")

    def _started_summary(self, request: NotifyRequest, run: RunContext, now: datetime) -> RunSummary:
        return RunSummary(
            run=run.run or request.execution,
            outcome="running",
            dataset_version=run.dataset_version,
            execution_arn=request.execution_arn,
            pair_count=run.pair_count,
            new_pairs=run.new_pairs,
            new_batches=run.new_batches,
            started_at=run.started_at,
            finished_at=now,
            baseline_run=run.accepted.run if run.accepted else None,
            code_archive_sha256=run.code.sha256 if run.code else None,
            artifacts=self._artifacts(prefixes.run_report_key(run.run or request.execution, "")),
        )

    def _failure_summary(self, request: NotifyRequest, now: datetime) -> RunSummary:
        state = request.state or RunState()
        if state.failed_state is None and self.sfn is not None and request.execution_arn:
            state = state.model_copy(update={"failed_state": failed_state(self.sfn, request.execution_arn)})
        failure = state.failure
        run = state.run
        name = run.run if run is not None and run.run else request.execution
        summary = RunSummary(
            run=name,
            outcome="stopped" if failure.error in STOPPED_ERRORS else "failed",
            dataset_version=(run.dataset_version if run else state.dataset_version) or "unknown",
            execution_arn=request.execution_arn,
            pair_count=run.pair_count if run else None,
            new_pairs=run.new_pairs if run else None,
            new_batches=run.new_batches if run else [],
            started_at=run.started_at if run else None,
            finished_at=now,
            duration_seconds=(now - run.started_at).total_seconds() if run and run.started_at else None,
            baseline_run=run.accepted.run if run and run.accepted else None,
            code_archive_sha256=run.code.sha256 if run and run.code else None,
            artifacts=self._artifacts(prefixes.failed_run_key(name, "")),
            failed_state=failure.state,
            error=failure.error,
            cause=failure.message,
        )
        key = prefixes.failed_run_key(name, "summary.json")
        DataBucket(self.s3, self.bucket).put_text(key, summary.model_dump_json(indent=2), "application/json")
        return summary
