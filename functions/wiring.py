"""The composition root: each function's logic built from its settings with the real clients.

Every handler has one shape: its decorators; parse its request; get its logic object here; one
call; return a model dump. Handlers call these builders and nothing else of AWS, so they stay
short; tests build the same objects with their own (stubbed) clients. Request models live in one
place, `functions/common/requests.py`; each function's logic is beside its handler (`logic.py`,
`run.py` for the training job).

Each builder imports its function's logic itself: every function is deployed from the same code,
and a cold start should load only its own (the intake never needs slack-sdk or the training-job
request builder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from functions.common import clients
from functions.common.settings import LedgerSettings
from functions.data.ledger import Ledger
from functions.data.run_lock import Executions, RunLock
from functions.data.storage import DataBucket
from functions.trigger.kick import TriggerKick

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    from functions.common.settings import (
        DatasetSyncSettings,
        EvaluateRunSettings,
        IntakeSettings,
        NotifySettings,
        PrepareRunSettings,
        ReleaseSettings,
        RunEndedSettings,
        SweeperSettings,
        TrainingJobSettings,
        TriggerSettings,
    )
    from functions.dataset_sync.logic import DatasetSync
    from functions.evaluate_run.logic import Evaluator
    from functions.intake.logic import Intake
    from functions.intake.redelivery import IntakeQueue
    from functions.notify.logic import Notifier
    from functions.prepare_run.logic import RunPreparer
    from functions.release.logic import Release
    from functions.run_ended.logic import RunEnded
    from functions.sweeper.logic import Sweeper
    from functions.training_job.run import TrainingJobs
    from functions.training_job.waiting import JobWaits
    from functions.trigger.logic import Trigger
    from functions.validation import FileChecker

# Handlers wear it as their innermost decorator: AWS still throttling or failing (5xx) after
# botocore's retries becomes `AwsServiceBusyError`, which the state machine retries later.
busy_is_retryable = clients.busy_is_retryable
LAMBDA_MAX_TIMEOUT_MS = 900_000


def _utc_now() -> datetime:
    return datetime.now(UTC)


def ledger_and_bucket(settings: LedgerSettings, data_key_arn: str | None = None) -> tuple[Ledger, DataBucket]:
    bucket = DataBucket(
        clients.s3(),
        settings.data_bucket,
        multipart_threshold=settings.copy_multipart_threshold_bytes,
        data_key_arn=data_key_arn,
    )
    return Ledger(clients.dynamodb(), settings.ledger_table), bucket


def kick(function_name: str) -> TriggerKick:
    return TriggerKick(clients.lambda_(), function_name)


# ---------------------------------------------------------------- intake and sweeper --
def intake(settings: IntakeSettings, check_file: FileChecker) -> Intake:
    """One Intake per invocation: it collects the batches the invocation touched and closed.
    `check_file`: the handler's `DecoderProcess`, kept for the execution environment's life."""
    from functions.intake.logic import Intake
    from functions.validation import DEFAULT_CONFIG

    # Uploads are checked against the stack's key: the bucket policy's rule, kept where it is enforced
    # last (and offline, where the emulator ignores the policy's conditions).
    ledger, bucket = ledger_and_bucket(settings, data_key_arn=settings.data_key_arn)
    return Intake(
        ledger=ledger,
        bucket=bucket,
        config=DEFAULT_CONFIG,
        check_file=check_file,
        kick=kick(settings.trigger_function),
    )


def intake_queue(settings: IntakeSettings) -> IntakeQueue | None:
    """The intake's own queue, and its markers of running records (None: no queue URL set)."""
    from functions.intake.redelivery import IntakeQueue

    if not settings.intake_queue_url:
        return None
    return IntakeQueue(clients.sqs(), settings.intake_queue_url, clients.dynamodb(), settings.idempotency_table)


def idempotency_store(settings: IntakeSettings) -> DynamoDBPersistenceLayer:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    return DynamoDBPersistenceLayer(table_name=settings.idempotency_table, boto3_client=clients.dynamodb())


def sweeper(settings: SweeperSettings) -> Sweeper:
    from functions.sweeper.logic import Sweeper

    ledger, bucket = ledger_and_bucket(settings)
    return Sweeper(
        ledger=ledger,
        bucket=bucket,
        quiet_for=timedelta(seconds=settings.quiet_period_seconds),
        incomplete_after=timedelta(seconds=settings.incomplete_after_seconds),
        kick=kick(settings.trigger_function),
    )


def trigger(settings: TriggerSettings) -> Trigger:
    from functions.trigger.logic import Trigger, TriggerPolicy
    from functions.validation import DEFAULT_CONFIG

    ledger, bucket = ledger_and_bucket(settings)
    policy = {f.name: getattr(settings, f.name) for f in fields(TriggerPolicy)}
    return Trigger(
        ledger=ledger,
        bucket=bucket,
        sfn=clients.stepfunctions(),
        state_machine_arn=settings.state_machine_arn,
        taxonomy=DEFAULT_CONFIG.taxonomy,
        policy=TriggerPolicy(**policy),
        clock=lambda: datetime.now(UTC),
    )


def release(settings: ReleaseSettings) -> Release:
    from functions.release.logic import Release

    ledger = Ledger(clients.dynamodb(), settings.ledger_table)
    return Release(lock=RunLock(ledger, _utc_now), kick=kick(settings.trigger_function))


# ------------------------------------------------------------------------- a run --
def run_preparer(settings: PrepareRunSettings) -> RunPreparer:
    from functions.prepare_run.logic import RunLockGuard, RunPreparer

    ledger = Ledger(clients.dynamodb(), settings.ledger_table)
    executions = Executions(clients.stepfunctions(), settings.state_machine_arn)
    lock = RunLockGuard(RunLock(ledger, _utc_now, executions), ttl_seconds=settings.lock_ttl_seconds)
    return RunPreparer(
        clients.s3(),
        settings.data_bucket,
        poll_seconds=settings.poll_seconds,
        poll_max_seconds=settings.poll_max_seconds,
        notify_on_start=settings.notify_on_start,
        lock=lock,
    )


def dataset_sync(settings: DatasetSyncSettings) -> DatasetSync:
    from functions.dataset_sync.logic import DatasetSync

    return DatasetSync(
        clients.fsx(),
        settings.data_bucket,
        file_system_id=settings.file_system_id,
        timeout_seconds=settings.import_timeout_seconds,
    )


def training_jobs(settings: TrainingJobSettings) -> TrainingJobs:
    from functions.training_job.run import TrainingJobs, job_config

    ledger = Ledger(clients.dynamodb(), settings.ledger_table)
    executions = Executions(clients.stepfunctions(), settings.state_machine_arn)
    return TrainingJobs(
        job_config(settings), clients.sagemaker(), clients.s3(), settings.data_bucket, ledger, executions
    )


def job_waits(settings: TrainingJobSettings) -> JobWaits:
    from functions.training_job.orphans import OrphanJobs
    from functions.training_job.waiting import JobWaits

    jobs = training_jobs(settings)
    assert jobs.ledger is not None and jobs.executions is not None
    orphans = OrphanJobs(jobs.sagemaker, jobs.executions, prefix=jobs.config.job_name_prefix)
    return JobWaits(jobs, jobs.ledger, clients.stepfunctions(), orphans)


def run_ended(settings: RunEndedSettings) -> RunEnded:
    from functions.run_ended.logic import RunEnded

    ledger = Ledger(clients.dynamodb(), settings.ledger_table)
    return RunEnded(
        ledger,
        clients.sagemaker(),
        clients.stepfunctions(),
        clients.lambda_(),
        settings.notify_function,
        settings.release_function,
    )


def evaluator(settings: EvaluateRunSettings) -> Evaluator:
    from functions.evaluate_run.gate import GatePolicy
    from functions.evaluate_run.logic import Evaluator
    from functions.evaluate_run.trust import TrustKeeper

    policy = GatePolicy(miou_tolerance=settings.gate_miou_tolerance, class_tolerance=settings.gate_class_tolerance)
    ledger, bucket = ledger_and_bucket(settings)
    return Evaluator(
        clients.s3(),
        clients.sagemaker(),
        settings.data_bucket,
        policy,
        settings.model_package_group,
        trust=TrustKeeper(ledger, bucket),
    )


def secrets_provider() -> SecretsProvider:
    """Call it once per cold start: the provider caches what it read (the Slack webhook secret)."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    return SecretsProvider(boto3_client=clients.secretsmanager())


def notifier(
    settings: NotifySettings, secrets: SecretsProvider, remaining_ms: Callable[[], int] | None = None
) -> Notifier:
    """`remaining_ms`: the invocation's remaining time (its Lambda context's), which a claim on a
    run end's message lasts; without it, Lambda's longest timeout."""
    from functions.data.ledger_run_ends import RunEndItems
    from functions.notify.logic import Notifier
    from functions.notify.once import OneMessage
    from functions.notify.secret import SlackWebhookSecret

    remaining = remaining_ms or (lambda: LAMBDA_MAX_TIMEOUT_MS)

    return Notifier(
        s3=clients.s3(),
        sns=clients.sns(),
        sts=clients.sts(),
        bucket=settings.data_bucket,
        topic_arn=settings.notification_topic_arn,
        region=settings.aws_region,
        report_reader_role_arn=settings.report_reader_role_arn,
        webhook=SlackWebhookSecret(secrets, settings.slack_webhook_secret_arn),
        sfn=clients.stepfunctions(),
        once=OneMessage(RunEndItems(clients.dynamodb(), settings.ledger_table), _utc_now, lambda: remaining() / 1000),
    )
