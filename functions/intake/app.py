"""Intake Lambda: SQS batches of S3 notifications -> checked, paired, curated or quarantined.

Each object version is processed once (Powertools Idempotency on bucket, key, version/ETag:
S3 and SQS both deliver at least once); a record that fails is retried alone (partial batch
failures) and lands in the DLQ after the queue's maxReceiveCount.
"""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.models import S3ObjectEvent
from functions.common.settings import IntakeSettings, load_settings
from functions.data.wiring import kick_trigger, ledger_and_bucket, report_closed
from functions.intake.logic import Intake, parse_notification
from functions.validation import DEFAULT_CONFIG

logger, tracer, metrics = observability.for_function()
processor = BatchProcessor(event_type=EventType.SQS)
idempotency = IdempotencyConfig(event_key_jmespath="[bucket, key, version_id, etag]")
persistence = DynamoDBPersistenceLayer(
    table_name=os.environ.get("IDEMPOTENCY_TABLE", "unset"), boto3_client=clients.dynamodb()
)
_intake: Intake | None = None


@idempotent_function(data_keyword_argument="obj", config=idempotency, persistence_store=persistence)  # type: ignore[untyped-decorator]
def process_object(obj: dict[str, Any]) -> str:
    assert _intake is not None
    status = _intake.process(S3ObjectEvent.model_validate(obj))
    logger.info("object processed", extra={"key": obj["key"], "status": status.value})
    metrics.add_metric(name=f"Objects{status.value.capitalize()}", unit="Count", value=1)
    return status.value


def handle_record(record: SQSRecord) -> None:
    assert _intake is not None
    for event in parse_notification(record.body):
        obj = event
        if event.version_id is None:
            # moto's events carry no versionId; AWS's do. Idempotency is per version either way.
            obj = event.model_copy(update={"version_id": _intake.bucket.current_version(event.key)})
        process_object(obj=obj.model_dump(mode="json"))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    global _intake  # noqa: PLW0603 (one Intake per invocation: it collects the batches touched)
    settings = load_settings(IntakeSettings)
    idempotency.register_lambda_context(context)
    ledger, bucket = ledger_and_bucket(settings)
    _intake = Intake(ledger=ledger, bucket=bucket, config=DEFAULT_CONFIG)
    response = process_partial_response(
        event=event, record_handler=handle_record, processor=processor, context=context
    )
    report_closed(_intake.touched, ledger, bucket)
    if _intake.newly_closed:
        kick_trigger(settings.trigger_function, "batch closed")
    return response
