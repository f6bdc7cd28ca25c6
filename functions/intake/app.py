"""Intake Lambda: SQS batches of S3 notifications -> ledger, with partial batch failures."""

from __future__ import annotations

from functools import partial
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import IntakeSettings, load_settings
from functions.intake.logic import Ledger, parse_notification

logger, tracer, metrics = observability.for_function()
processor = BatchProcessor(event_type=EventType.SQS)


def handle_record(record: SQSRecord, ledger: Ledger) -> None:
    for obj in parse_notification(record.body):
        ledger.record_received(obj)
        logger.info("object received", extra={"key": obj.key, "batch": obj.batch})
        metrics.add_metric(name="ObjectsReceived", unit="Count", value=1)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    settings = load_settings(IntakeSettings)
    ledger = Ledger(clients.dynamodb(), settings.ledger_table)
    return process_partial_response(
        event=event,
        record_handler=partial(handle_record, ledger=ledger),
        processor=processor,
        context=context,
    )
