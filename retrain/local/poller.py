"""Play Lambda's SQS event-source mapping: poll, batch, invoke, delete what succeeded.

As on AWS: up to `BatchSize` messages gathered for at most `MaximumBatchingWindowInSeconds`; with
`ReportBatchItemFailures` only the messages named in `batchItemFailures` stay on the queue (a
malformed answer or a handler error fails the whole batch); failed messages come back after the
queue's visibility timeout, and SQS itself moves a message to the dead-letter queue once it has
been received `maxReceiveCount` times.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from functions.common.errors import RetrainError
from retrain.local.lambdas import LambdaRuntime

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

log = logging.getLogger(__name__)

SQS_MAX_RECEIVE = 10


class EventSourceMappingError(RetrainError, ValueError):
    """A mapping that Lambda's CreateEventSourceMapping would refuse."""


@dataclass(frozen=True)
class EventSourceMapping:
    function: str
    queue_url: str
    queue_arn: str
    batch_size: int = 10
    batching_window_seconds: float = 0.0
    report_batch_item_failures: bool = False


@dataclass(frozen=True)
class BatchOutcome:
    received: int
    failed_ids: frozenset[str]


class SqsPoller:
    """One thread per mapping, stopped cleanly by `stop()`."""

    def __init__(
        self,
        sqs: SQSClient,
        runtime: LambdaRuntime,
        region: str,
        *,
        window_override: float | None = None,
    ) -> None:
        self._sqs = sqs
        self._runtime = runtime
        self._region = region
        # Tests and demos may shorten every batching window (as `tick_seconds` does schedules).
        self._window_override = window_override
        self._mappings: list[EventSourceMapping] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, mapping: EventSourceMapping) -> None:
        """Refuse what CreateEventSourceMapping refuses: a visibility timeout below the timeout."""
        visibility = int(
            self._sqs.get_queue_attributes(QueueUrl=mapping.queue_url, AttributeNames=["VisibilityTimeout"])[
                "Attributes"
            ]["VisibilityTimeout"]
        )
        timeout = self._runtime.spec(mapping.function).timeout_seconds
        if visibility < timeout:
            raise EventSourceMappingError(
                f"queue {mapping.queue_arn}: visibility timeout {visibility} s is less than "
                f"the timeout of {mapping.function}, {timeout} s (Lambda refuses this mapping)"
            )
        self._mappings.append(mapping)

    @property
    def mappings(self) -> list[EventSourceMapping]:
        return list(self._mappings)

    def start(self) -> None:
        self._stop.clear()
        for mapping in self._mappings:
            thread = threading.Thread(target=self._run, args=(mapping,), name=f"poller-{mapping.function}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()

    def _run(self, mapping: EventSourceMapping) -> None:
        while not self._stop.is_set():
            try:
                outcome = self.poll_once(mapping)
            except Exception:
                log.exception("polling %s for %s failed", mapping.queue_url, mapping.function)
                outcome = BatchOutcome(0, frozenset())
            if outcome.received == 0:
                self._stop.wait(0.2)

    def poll_once(self, mapping: EventSourceMapping, wait_seconds: float = 0.5) -> BatchOutcome:
        """Gather one batch and deliver it; the unit the thread repeats (and tests call)."""
        messages = self._gather(mapping, wait_seconds)
        # A message whose visibility ran out while the batch was gathered comes back twice:
        # deliver it once, with its newest receipt handle.
        messages = list({m["MessageId"]: m for m in messages}.values())
        if not messages:
            return BatchOutcome(0, frozenset())
        event = {"Records": [self._record(mapping, message) for message in messages]}
        invocation = self._runtime.invoke(mapping.function, event)
        all_ids = {message["MessageId"] for message in messages}
        if invocation.failed:
            failed = all_ids
        elif mapping.report_batch_item_failures:
            failed = _reported_failures(invocation.payload, all_ids)
        else:
            failed = set()
        if failed:
            # As Lambda's poller is silent about it, but here nobody watches the function's logs.
            log.warning(
                "%s: %d of %d messages from %s failed%s; they come back after the visibility timeout "
                "(to the dead-letter queue after maxReceiveCount)",
                mapping.function,
                len(failed),
                len(messages),
                mapping.queue_url.rsplit("/", 1)[-1],
                f" (the handler raised {invocation.error_type})" if invocation.failed else "",
            )
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), SQS_MAX_RECEIVE):
            chunk = done[start : start + SQS_MAX_RECEIVE]
            self._sqs.delete_message_batch(
                QueueUrl=mapping.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)],
            )
        return BatchOutcome(len(messages), frozenset(failed))

    def _gather(self, mapping: EventSourceMapping, wait_seconds: float) -> list[MessageTypeDef]:
        messages: list[MessageTypeDef] = []
        started = time.monotonic()
        window = self._window_override
        window_ends = started + (mapping.batching_window_seconds if window is None else window)
        poll_ends = started + wait_seconds  # like a long poll, without holding up stop()
        while len(messages) < mapping.batch_size and not self._stop.is_set():
            received = self._sqs.receive_message(
                QueueUrl=mapping.queue_url,
                MaxNumberOfMessages=min(SQS_MAX_RECEIVE, mapping.batch_size - len(messages)),
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            messages.extend(received)
            now = time.monotonic()
            if received:
                continue
            if now >= (window_ends if messages else poll_ends):
                break
            self._stop.wait(0.05)
        return messages

    def _record(self, mapping: EventSourceMapping, message: MessageTypeDef) -> dict[str, Any]:
        body = message.get("Body", "")
        return {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": body,
            "attributes": dict(message.get("Attributes", {})),
            "messageAttributes": {
                name: {
                    "stringValue": value.get("StringValue"),
                    "binaryValue": value.get("BinaryValue"),
                    "stringListValues": [],
                    "binaryListValues": [],
                    "dataType": value["DataType"],
                }
                for name, value in message.get("MessageAttributes", {}).items()
            },
            "md5OfBody": message.get("MD5OfBody") or hashlib.md5(body.encode()).hexdigest(),  # noqa: S324 (SQS's own checksum)
            "eventSource": "aws:sqs",
            "eventSourceARN": mapping.queue_arn,
            "awsRegion": self._region,
        }


def _reported_failures(payload: Any, all_ids: set[str]) -> set[str]:
    """The ids a ReportBatchItemFailures answer names; a malformed answer fails the batch."""
    if payload is None or payload == {}:
        return set()
    items = payload.get("batchItemFailures") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return all_ids
    failed: set[str] = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not isinstance(identifier, str) or identifier not in all_ids:
            return all_ids
        failed.add(identifier)
    return failed
