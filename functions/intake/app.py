"""Intake Lambda: SQS batches of S3 notifications -> checked, paired, curated or quarantined.

Each object version is processed once (Powertools Idempotency on the object version alone: S3
and SQS both deliver at least once); a record that fails is retried alone (partial batch
failures) and lands in the DLQ after the queue's maxReceiveCount. Records are started most-delivered
first, and only while enough of the invocation is left (`budget.py`); the others go back unstarted.
"""

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
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.errors import IntakeOutOfTimeError, ObjectGoneError, RefusedEventError
from functions.common.models import S3ObjectEvent
from functions.common.settings import IntakeSettings, load_settings
from functions.intake.budget import TimeBudget, deliveries, most_delivered_first
from functions.intake.logic import IDEMPOTENCY_KEY_PREFIX, OBJECT_VERSION_KEY, Intake

logger, tracer, metrics = observability.for_function()
settings = load_settings(IntakeSettings)  # at cold start: a deployment mistake fails every call
processor = BatchProcessor(event_type=EventType.SQS)
idempotency = IdempotencyConfig(event_key_jmespath=OBJECT_VERSION_KEY)
GONE = "gone"
REFUSED = "refused"


@idempotent_function(  # type: ignore[untyped-decorator]
    data_keyword_argument="obj",
    config=idempotency,
    persistence_store=wiring.idempotency_store(settings),
    key_prefix=IDEMPOTENCY_KEY_PREFIX,
)
def process_object(*, obj: dict[str, Any], intake: Intake) -> str:
    try:
        status = intake.process(S3ObjectEvent.model_validate(obj))
    except RefusedEventError as refused:
        # Forged or misrouted: logged and counted for the alarm, never retried into the DLQ.
        logger.warning("event refused", extra={"bucket": obj.get("bucket"), "key": obj["key"], "reason": str(refused)})
        metrics.add_metric(name="EventsRefused", unit="Count", value=1)
        return REFUSED
    except ObjectGoneError as gone:
        # Deleted before we got to it (erased, or withdrawn by its uploader): there is nothing to
        # keep, and a retry would fail the same way until the message reached the DLQ.
        logger.warning("object version gone before it was processed", extra={"key": obj["key"], "reason": str(gone)})
        metrics.add_metric(name="ObjectsGone", unit="Count", value=1)
        return GONE
    logger.info("object processed", extra={"key": obj["key"], "status": status.value})
    metrics.add_metric(name=f"Objects{status.value.capitalize()}", unit="Count", value=1)
    return status.value


def handle_record(record: SQSRecord, *, intake: Intake, budget: TimeBudget) -> None:
    try:
        budget.check()
    except IntakeOutOfTimeError as late:
        logger.warning("record sent back unstarted", extra={**_about(record), "reason": str(late)})
        metrics.add_metric(name="RecordsDeferred", unit="Count", value=1)
        raise
    key = None  # the object the record failed on, for the log
    try:
        for obj in intake.objects_in(record.body):
            key = obj.key
            process_object(obj=obj.model_dump(mode="json"), intake=intake)
    except IdempotencyAlreadyInProgressError:
        # A copy of a message whose original another invocation is working on: that one finishes it.
        logger.info("record sent back: its object version is being processed", extra={**_about(record), "key": key})
        raise
    except Exception as error:
        # Lambda's poller says nothing about a failed record: without this line, a message that
        # comes back after the visibility timeout (or ends in the DLQ) leaves no cause behind.
        logger.warning(
            "record failed: SQS delivers it again after the visibility timeout",
            extra={**_about(record), "key": key, "error": type(error).__name__, "reason": str(error)},
        )
        raise


def _about(record: SQSRecord) -> dict[str, Any]:
    return {"message_id": record.message_id, "deliveries": deliveries(record.raw_event)}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    idempotency.register_lambda_context(context)
    intake = wiring.intake(settings)
    budget = TimeBudget.of(context.get_remaining_time_in_millis)
    response = process_partial_response(
        event=most_delivered_first(event),
        record_handler=partial(handle_record, intake=intake, budget=budget),
        processor=processor,
        context=context,
    )
    intake.finish()
    return response
