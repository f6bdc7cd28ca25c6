"""The composition root: each function's logic built from its settings with the real clients.

Handlers call these and nothing else of AWS, so they stay short; tests build the same objects
with their own clients.
"""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime

from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

from functions.common import clients
from functions.common.settings import IntakeSettings, LedgerSettings, TriggerSettings
from functions.data.ledger import Ledger
from functions.data.storage import DataBucket
from functions.intake.logic import Intake
from functions.trigger.logic import Trigger, TriggerPolicy
from functions.validation import DEFAULT_CONFIG


def ledger_and_bucket(settings: LedgerSettings) -> tuple[Ledger, DataBucket]:
    bucket = DataBucket(clients.s3(), settings.data_bucket, multipart_threshold=settings.copy_multipart_threshold_bytes)
    return Ledger(clients.dynamodb(), settings.ledger_table), bucket


def intake(settings: LedgerSettings) -> Intake:
    """One Intake per invocation: it collects the batches the invocation touched and closed."""
    ledger, bucket = ledger_and_bucket(settings)
    return Intake(ledger=ledger, bucket=bucket, config=DEFAULT_CONFIG)


def idempotency_store(settings: IntakeSettings) -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(table_name=settings.idempotency_table, boto3_client=clients.dynamodb())


def trigger(settings: TriggerSettings) -> Trigger:
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


def kick_trigger(function_name: str, reason: str) -> None:
    """Run the trigger soon, without waiting for it (it decides whether anything starts)."""
    if not function_name:
        return
    clients.lambda_().invoke(
        FunctionName=function_name,
        InvocationType="Event",
        Payload=json.dumps({"source": reason, "time": datetime.now(UTC).isoformat()}).encode(),
    )
