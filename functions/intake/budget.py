"""An invocation's time and a batch's order: which records are started, in what order, and what
becomes of those left when time runs short.

A batch of up to 100 large objects can outlast the function's timeout. Lambda then fails the
whole batch: every message comes back, those already processed included, and each delivery counts
towards the queue's maxReceiveCount, so healthy messages drift towards the dead-letter queue. So a
record is started only while more than a margin is left: the margin covers one record at its worst
(a file checked until the decode limit kills the check, a 64 MiB read and copy, a few ledger
writes) and the reports written at the end, so a started record is finished and the invocation
never times out on a record it chose to start.

What keeps a healthy message out of the DLQ, and puts a poison one there alone:
- A record left unstarted for lack of time, on its first delivery, is sent to the queue again as a
  new message and reported done (`redelivery.py`): waiting costs it no try. (Sent back as a failure, as
  before, every wait counted a try, and a slow record heading every batch pushed the others, batch
  after batch, into the DLQ.)
- Records delivered for the first time go first, in SQS's order; records SQS delivers again
  (they failed, or their invocation died, or waited twice) go after them, least-delivered first.
  A record that fails every time is therefore the last of its batch, where it holds up no other.
- A record on its last try (delivered maxReceiveCount times: if it fails now, SQS moves it to the
  DLQ) comes last, and the records before it are started only while a margin is kept for it too:
  it gets its try after the rest of its batch is done, and if it fails, it goes to the DLQ alone.
- A record that ends its whole invocation (a timeout, a crash) is kept from taking its batch with
  it: `redelivery.py`.
`RecordsDeferred` counts the records left unstarted: if it is steady, lower BatchSize (or raise the
timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from functions.common.errors import IntakeOutOfTimeError

# Kept back beside the decode limit: a 64 MiB read and copy, the ledger writes, the reports.
IO_MARGIN_MS = 5_000
# ... at most this share of the invocation's time (the offline stack's tests run with a 1 s
# timeout, and a fixed 15 s would start nothing there).
MARGIN_SHARE = 0.25
DEFAULT_DECODE_LIMIT_MS = 10_000  # IntakeSettings.decode_timeout_seconds


@dataclass(frozen=True)
class TimeBudget:
    remaining_ms: Callable[[], int]  # the Lambda context's get_remaining_time_in_millis
    margin_ms: int

    @classmethod
    def of(cls, remaining_ms: Callable[[], int], decode_limit_ms: int = DEFAULT_DECODE_LIMIT_MS) -> TimeBudget:
        """The budget of an invocation that starts now, whose files are checked within `decode_limit_ms`."""
        return cls(remaining_ms, min(IO_MARGIN_MS + decode_limit_ms, int(remaining_ms() * MARGIN_SHARE)))

    def check(self, kept_for: int = 0) -> None:
        """Raise `IntakeOutOfTimeError` when too little is left to start another record and still
        start the `kept_for` records on their last try that wait after it."""
        left, needed = self.remaining_ms(), self.margin_ms * (1 + kept_for)
        if left < needed:
            kept = f" and {kept_for} records on their last try after it" if kept_for else ""
            raise IntakeOutOfTimeError(
                f"{left} ms of the invocation left, less than the {needed} ms kept for a record{kept} "
                "and the reports: not started"
            )


def in_delivery_order(event: dict[str, Any], died_running: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The SQS event with its records ordered by SQS's ApproximateReceiveCount, lowest first (in
    SQS's order among equals): first deliveries, then the records delivered again, the ones on
    their last try at the end; and after all of them, the `died_running` ones (message ids: a
    record that was running when an invocation died, `redelivery.py`)."""
    records = event.get("Records", [])
    return {**event, "Records": sorted(records, key=lambda r: (r.get("messageId") in died_running, deliveries(r)))}


def deliveries(record: dict[str, Any]) -> int:
    """How often SQS has delivered this record (1 when it does not say)."""
    try:
        return int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
    except (TypeError, ValueError):
        return 1


def on_last_try(record: dict[str, Any], max_receive_count: int) -> bool:
    """Delivered `max_receive_count` times: if it fails now, SQS moves it to the DLQ."""
    return deliveries(record) >= max_receive_count
