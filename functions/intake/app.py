"""Intake Lambda: SQS batches of S3 notifications -> checked, paired, curated or quarantined.

Each object version is processed once (Powertools Idempotency on the object version alone: S3
and SQS both deliver at least once); a record that fails is retried alone (partial batch
failures) and lands in the DLQ after the queue's maxReceiveCount. Records are started first
deliveries first, the ones on their last try last, and only while enough of the invocation is left
(`budget.py`); the others wait, sent to the queue again. Files are checked in a child process
without AWS credentials, killed at the decode limit (`functions/validation/decoder_process.py`).
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
from functions.intake.budget import TimeBudget, deliveries, in_delivery_order, on_last_try
from functions.intake.logic import IDEMPOTENCY_KEY_PREFIX, OBJECT_VERSION_KEY, Intake
from functions.intake.redelivery import IntakeQueue
from functions.validation import DecoderProcess, keep_from_children

logger, tracer, metrics = observability.for_function()
settings = load_settings(IntakeSettings)  # at cold start: a deployment mistake fails every call
processor = BatchProcessor(event_type=EventType.SQS)
idempotency = IdempotencyConfig(event_key_jmespath=OBJECT_VERSION_KEY)
# One child process for the execution environment's life, warm starts included (its start costs
# an interpreter's imports); replaced only after a file killed or crashed it. The child gets no
# credentials, and this process hides its own (its environment, its memory) from it.
keep_from_children()
decoder = DecoderProcess(settings.decode_timeout_seconds)
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


def handle_record(
    record: SQSRecord, *, intake: Intake, budget: TimeBudget, last_tries: int, queue: IntakeQueue | None
) -> None:
    """`last_tries`: the batch's records on their last try, which come last and get their time."""
    suspect = deliveries(record.raw_event) > 1  # it failed, or its invocation died, or it waited twice
    try:
        budget.check(kept_for=0 if on_last_try(record.raw_event, settings.max_receive_count) else last_tries)
    except IntakeOutOfTimeError as late:
        metrics.add_metric(name="RecordsDeferred", unit="Count", value=1)
        if queue is not None and not suspect:
            # Never tried: sent again as a new message, this one done, so waiting costs no try.
            # A suspect goes back as a failure: one that fails every time must count its tries.
            queue.send_again(record.body)
            queue.done(record.message_id, record.receipt_handle)
            logger.warning("record sent to the queue again, unstarted", extra={**_about(record), "reason": str(late)})
            return
        logger.warning("record sent back unstarted", extra={**_about(record), "reason": str(late)})
        raise
    if queue is not None and suspect:
        # Should this one end the invocation, what is done stays done, and its marker says so.
        queue.delete_finished()
        queue.started(record.message_id)
    try:
        _process_record(record, intake)
    except Exception:
        if queue is not None and suspect:
            queue.ended(record.message_id)  # it ended (failed), the invocation did not
        raise
    if queue is not None:
        if suspect:
            queue.ended(record.message_id)
        queue.done(record.message_id, record.receipt_handle)


def _process_record(record: SQSRecord, intake: Intake) -> None:
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


def _in_order(event: dict[str, Any], queue: IntakeQueue | None) -> dict[str, Any]:
    """The batch in the order its records are started (`budget.in_delivery_order`)."""
    suspects = [r["messageId"] for r in event.get("Records", []) if deliveries(r) > 1]
    died_running = queue.died_running(suspects) if queue is not None and suspects else set()
    for message_id in died_running:
        logger.warning("record was running when an invocation died: it goes last", extra={"message_id": message_id})
    return in_delivery_order(event, frozenset(died_running))


def _about(record: SQSRecord) -> dict[str, Any]:
    return {"message_id": record.message_id, "deliveries": deliveries(record.raw_event)}


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    idempotency.register_lambda_context(context)
    intake = wiring.intake(settings, decoder)
    budget = TimeBudget.of(context.get_remaining_time_in_millis, int(settings.decode_timeout_seconds * 1000))
    queue = wiring.intake_queue(settings)
    ordered = _in_order(event, queue)
    last_tries = sum(on_last_try(record, settings.max_receive_count) for record in ordered["Records"])
    handle = partial(handle_record, intake=intake, budget=budget, last_tries=last_tries, queue=queue)
    response = process_partial_response(
        event=ordered,
        record_handler=handle,
        processor=processor,
        context=context,
    )
    intake.finish()
    return response
