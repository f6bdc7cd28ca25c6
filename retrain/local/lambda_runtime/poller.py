"""Play Lambda's SQS event-source mapping: poll, batch, invoke, delete what succeeded.

As on AWS: up to `BatchSize` messages gathered for at most `MaximumBatchingWindowInSeconds`; with
`ReportBatchItemFailures` only the messages named in `batchItemFailures` stay on the queue (a
malformed answer or a handler error fails the whole batch); failed messages come back after the
queue's visibility timeout, and SQS itself moves a message to the dead-letter queue once it has
been received `maxReceiveCount` times.

Several pollers may serve one mapping (`pollers`), each gathering and invoking on its own, so
batches of one queue are processed at the same time, as Lambda's do. And delivery need not be
kinder than AWS's (`delivery`):

- "ordered": each batch as SQS returned it (SQS standard queues promise no order; moto keeps it).
- "shuffled": each batch is shuffled, and of the messages received for the first time into a batch
  of two or more, a random number between none and half (rounded down) is held back: they wait in
  this poller, still in flight, and join the mapping's next batch (whichever poller gathers it),
  whose visibility clock they restart. So a file uploaded first can be processed after one uploaded
  later, in another batch as well as within one.
- "duplicated": as "shuffled", and each message is, with probability `duplicate_fraction`, sent to
  the queue a second time (its body and attributes, so the copy is a distinct SQS message carrying
  the same S3 record), as S3's at-least-once notifications do. A message is copied at most once,
  and a copy never.

The choices come from one `random.Random(seed)`, logged at start: the same seed makes the same
choices for the same sequence of batches (with several pollers, which poller receives which
messages still depends on timing).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from functions.common.errors import RetrainError
from retrain.local.lambda_runtime.lambdas import LambdaRuntime

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        MessageAttributeValueOutputTypeDef,
        MessageAttributeValueTypeDef,
        MessageTypeDef,
    )

log = logging.getLogger(__name__)

SQS_MAX_RECEIVE = 10
Delivery = Literal["ordered", "shuffled", "duplicated"]
DELIVERIES: tuple[Delivery, ...] = get_args(Delivery)


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
    # ScalingConfig.MaximumConcurrency: Lambda runs no more pollers' batches at once than this.
    maximum_concurrency: int | None = None


@dataclass(frozen=True)
class BatchOutcome:
    received: int
    failed_ids: frozenset[str]


class SqsPoller:
    """`pollers` threads per mapping, stopped cleanly by `stop()`."""

    def __init__(
        self,
        sqs: SQSClient,
        runtime: LambdaRuntime,
        region: str,
        *,
        window_override: float | None = None,
        pollers: int = 1,
        delivery: Delivery = "ordered",
        duplicate_fraction: float = 0.2,
        seed: int | None = None,
    ) -> None:
        if pollers < 1:
            raise ValueError(f"a mapping needs at least one poller, not {pollers}")
        if delivery not in DELIVERIES:
            raise ValueError(f"delivery is one of {', '.join(DELIVERIES)}, not {delivery!r}")
        if not 0.0 <= duplicate_fraction <= 1.0:
            raise ValueError(f"duplicate_fraction is between 0 and 1, not {duplicate_fraction}")
        self._sqs = sqs
        self._runtime = runtime
        self._region = region
        # Tests and demos may shorten every batching window (as `tick_seconds` does schedules).
        self._window_override = window_override
        self.pollers = pollers
        self.delivery = delivery
        self.duplicate_fraction = duplicate_fraction
        self.seed = random.SystemRandom().randrange(2**32) if seed is None else seed
        self._random = random.Random(self.seed)  # noqa: S311 (a replayable shuffle, no secret)
        self._mappings: list[EventSourceMapping] = []
        self._visibility: dict[EventSourceMapping, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Under `_lock`: the random choices, the held-back messages, what was copied once.
        self._lock = threading.Lock()
        self._held: dict[EventSourceMapping, list[MessageTypeDef]] = {}
        self._copied: set[str] = set()
        self.copies_sent = 0
        if delivery != "ordered":
            log.info("SQS delivery %s, seed %d (delivery_seed=%d replays its choices)", delivery, self.seed, self.seed)

    def add(self, mapping: EventSourceMapping) -> None:
        """Refuse what CreateEventSourceMapping refuses: a visibility timeout below the timeout."""
        visibility = int(
            self._sqs.get_queue_attributes(QueueUrl=mapping.queue_url, AttributeNames=["VisibilityTimeout"])[
                "Attributes"
            ]["VisibilityTimeout"]
        )
        if mapping.maximum_concurrency is not None and not 2 <= mapping.maximum_concurrency <= 1000:
            raise EventSourceMappingError(
                f"queue {mapping.queue_arn}: ScalingConfig.MaximumConcurrency is 2 to 1000, "
                f"not {mapping.maximum_concurrency} (Lambda refuses this mapping)"
            )
        timeout = self._runtime.spec(mapping.function).timeout_seconds
        if visibility < timeout:
            raise EventSourceMappingError(
                f"queue {mapping.queue_arn}: visibility timeout {visibility} s is less than "
                f"the timeout of {mapping.function}, {timeout} s (Lambda refuses this mapping)"
            )
        self._mappings.append(mapping)
        self._visibility[mapping] = visibility

    @property
    def mappings(self) -> list[EventSourceMapping]:
        return list(self._mappings)

    def start(self) -> None:
        self._stop.clear()
        for mapping in self._mappings:
            for index in range(min(self.pollers, mapping.maximum_concurrency or self.pollers)):
                thread = threading.Thread(
                    target=self._run, args=(mapping,), name=f"poller-{mapping.function}-{index}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()
        with self._lock:
            # Still in flight: SQS hands them out again after their visibility timeout.
            self._held.clear()

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
        held = self._take_held(mapping)
        received = self._gather(mapping, wait_seconds, room=mapping.batch_size - len(held), holding=bool(held))
        # A message whose visibility ran out while the batch was gathered comes back twice:
        # deliver it once, with its newest receipt handle.
        messages = list({m["MessageId"]: m for m in [*held, *received]}.values())
        if self.delivery != "ordered":
            messages = self._disorder(mapping, messages, fresh=received)
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

    def _take_held(self, mapping: EventSourceMapping) -> list[MessageTypeDef]:
        """The messages an earlier batch held back, with a fresh visibility timeout: the time
        they waited must not let SQS hand them to another poller meanwhile."""
        with self._lock:
            held = self._held.get(mapping, [])
            taken, self._held[mapping] = held[: mapping.batch_size], held[mapping.batch_size :]
        for start in range(0, len(taken), SQS_MAX_RECEIVE):
            self._sqs.change_message_visibility_batch(
                QueueUrl=mapping.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": self._visibility[mapping]}
                    for i, m in enumerate(taken[start : start + SQS_MAX_RECEIVE])
                ],
            )
        return taken

    def _disorder(
        self, mapping: EventSourceMapping, messages: list[MessageTypeDef], fresh: list[MessageTypeDef]
    ) -> list[MessageTypeDef]:
        """Shuffle the batch, hold some of its fresh messages back for the next one, and (when
        duplicating) send copies of some to the queue; what is delivered now."""
        fresh_ids = {m["MessageId"] for m in fresh}
        candidates = [m for m in messages if m["MessageId"] in fresh_ids]
        with self._lock:
            rng = self._random
            hold = rng.sample(candidates, rng.randint(0, len(candidates) // 2)) if len(candidates) > 1 else []
            copies: list[MessageTypeDef] = []
            if self.delivery == "duplicated":
                for message in candidates:
                    if message["MessageId"] not in self._copied and rng.random() < self.duplicate_fraction:
                        copies.append(message)
                        self._copied.add(message["MessageId"])
            held_ids = {m["MessageId"] for m in hold}
            delivered = [m for m in messages if m["MessageId"] not in held_ids]
            rng.shuffle(delivered)
            self._held.setdefault(mapping, []).extend(hold)
            # Under the lock: another poller may receive a copy as soon as it is sent, and must
            # find it known as one (a copy is not copied again).
            for message in copies:
                copy_id = self._sqs.send_message(
                    QueueUrl=mapping.queue_url,
                    MessageBody=message.get("Body", ""),
                    MessageAttributes=_sendable(message.get("MessageAttributes", {})),
                )["MessageId"]
                self._copied.add(copy_id)
                self.copies_sent += 1
                log.debug("%s: message %s sent again as %s", mapping.function, message["MessageId"], copy_id)
        return delivered

    def _gather(
        self, mapping: EventSourceMapping, wait_seconds: float, *, room: int | None = None, holding: bool = False
    ) -> list[MessageTypeDef]:
        """Up to `room` (the batch size) messages; when `holding` some already, the batching
        window applies from the start, as it would once one message is in."""
        messages: list[MessageTypeDef] = []
        room = mapping.batch_size if room is None else room
        started = time.monotonic()
        window = self._window_override
        window_ends = started + (mapping.batching_window_seconds if window is None else window)
        poll_ends = started + wait_seconds  # like a long poll, without holding up stop()
        while len(messages) < room and not self._stop.is_set():
            received = self._sqs.receive_message(
                QueueUrl=mapping.queue_url,
                MaxNumberOfMessages=min(SQS_MAX_RECEIVE, room - len(messages)),
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            messages.extend(received)
            now = time.monotonic()
            if received:
                continue
            if now >= (window_ends if messages or holding else poll_ends):
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


def _sendable(attributes: dict[str, MessageAttributeValueOutputTypeDef]) -> dict[str, MessageAttributeValueTypeDef]:
    """Received message attributes as SendMessage takes them (the list members are unused)."""
    sendable: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in attributes.items():
        entry: MessageAttributeValueTypeDef = {"DataType": value["DataType"]}
        if "StringValue" in value:
            entry["StringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            entry["BinaryValue"] = value["BinaryValue"]
        sendable[name] = entry
    return sendable


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
