"""An invocation's time: a record is started only while enough of it is left.

A batch of up to 100 large objects can outlast the function's timeout. Lambda then fails the
whole batch: every message comes back, those already processed included, and each delivery counts
towards the queue's maxReceiveCount, so healthy messages drift towards the dead-letter queue. So a
record is started only while more than a margin is left; the rest are reported as partial batch
failures without being touched, and come back after the visibility timeout.

That still counts a receive for each record sent back. What keeps a healthy one from reaching the
DLQ this way:
- the margin covers one record at its worst (a 64 MiB file read and decoded, a copy of at most
  that, a few ledger writes: seconds) and the reports written at the end, so a started record is
  finished and the invocation never times out on a record it chose to start;
- a batch is worked through most-delivered first, so a record sent back once goes ahead of every
  fresher record in whatever batch it comes back in: it is sent back again only if its whole
  batch is records delivered at least as often, which needs sustained overload, not one large drop;
- the template's BatchSize is sized from the benchmark (a full batch of 2048x1024 pairs takes a
  tenth of the timeout), so records are sent back only when a batch is ten times slower than that.
`RecordsDeferred` counts them: if it is steady, lower BatchSize (or raise the timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from functions.common.errors import IntakeOutOfTimeError

# At most this is kept back, or this share of the invocation's time when that is shorter (the
# offline stack's tests run with a 1 s timeout, and a fixed 10 s would start nothing there).
MARGIN_MS = 10_000
MARGIN_SHARE = 0.25


@dataclass(frozen=True)
class TimeBudget:
    remaining_ms: Callable[[], int]  # the Lambda context's get_remaining_time_in_millis
    margin_ms: int

    @classmethod
    def of(cls, remaining_ms: Callable[[], int]) -> TimeBudget:
        """The budget of an invocation that starts now."""
        return cls(remaining_ms, min(MARGIN_MS, int(remaining_ms() * MARGIN_SHARE)))

    def check(self) -> None:
        """Raise `IntakeOutOfTimeError` when too little is left to start another record."""
        left = self.remaining_ms()
        if left < self.margin_ms:
            raise IntakeOutOfTimeError(
                f"{left} ms of the invocation left, less than the {self.margin_ms} ms kept for a record "
                "and the reports: sent back to the queue unstarted"
            )


def most_delivered_first(event: dict[str, Any]) -> dict[str, Any]:
    """The SQS event with its records ordered by SQS's ApproximateReceiveCount, highest first (in
    SQS's order among equals): a record sent back for lack of time is first in its next batch."""
    return {**event, "Records": sorted(event.get("Records", []), key=deliveries, reverse=True)}


def deliveries(record: dict[str, Any]) -> int:
    """How often SQS has delivered this record (1 when it does not say)."""
    try:
        return int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
    except (TypeError, ValueError):
        return 1
