"""One message per run end, whoever sends it and however often they are asked to.

Three parties may tell the team how a run ended: the state machine's failure branch (Notify),
RunEndedFunction (through Notify) and `retrain runs cancel` (in its own process); a Lambda retry,
an EventBridge redelivery or a duplicated event asks any of them again, at any moment. Whoever
frees the run's lock owing the message records the run's end, `owed`, in the same transaction
(`RunLock.release`, `functions/data/ledger_run_ends.py`), and every sender sends through
`OneMessage.send`, which the record decides:

- owed (or claimed by a sender whose claim has lapsed): claim it, send, mark it sent. A send that
  fails gives the claim back, so the next try (the failed caller's retry, RunEndedFunction after
  the failure branch, a cancel) sends it: a failed message is not lost;
- sent: nothing is sent;
- claimed by another sender still within its claim (the same end delivered twice at once): wait
  for it, then send nothing if it sent, or claim it if it gave up; still claimed after the wait:
  `RunEndMessagePendingError`, retried later, never a silent success;
- no record: no lock was freed owing a message (a run refused before it held the lock, or a
  finished run, whose last state tells before it releases): send, as its one sender.

A claim lasts as long as its sender can: the invocation's remaining time (Notify passes its
Lambda context's), so a sender that died mid-send holds nobody up for longer. The one duplicate
left: a sender that dies between the message leaving and the mark being written is taken for
one that did not send, and the message goes again after its claim lapses; a message is never
lost for a duplicate's sake, the other way round.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from functions.common.errors import RunEndMessagePendingError
from functions.data.ledger_run_ends import RunEndItems
from functions.data.models import RunEnd, RunEndMessage

log = logging.getLogger(__name__)
SentT = TypeVar("SentT")
# Clocks of two Lambda hosts may differ a little: a claim outlives its sender by this much.
CLAIM_MARGIN_SECONDS = 10.0


@dataclass(frozen=True)
class OneMessage:
    records: RunEndItems
    clock: Callable[[], datetime]
    # How long this sender may still be sending: its claim lasts that long (plus the margin).
    sender_seconds: Callable[[], float]
    # How long a duplicate waits for the sender it lost the claim to.
    wait_seconds: float = 20.0
    poll_seconds: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def send(self, run: str, send: Callable[[], SentT], message_id: Callable[[SentT], str | None]) -> SentT | RunEnd:
        """`send()`'s result if this call sent the message; the run's end as recorded if it had
        been sent already (and nothing is sent now)."""
        waited = 0.0
        while True:
            end = self.records.run_end(run)
            if end is None:
                return send()
            if end.message is RunEndMessage.SENT:
                return end
            token, now = uuid.uuid4().hex, self.clock()
            until = now + timedelta(seconds=self.sender_seconds() + CLAIM_MARGIN_SECONDS)
            if self.records.claim_run_end_message(run, token, now=now, until=until):
                return self._send_claimed(run, token, send, message_id)
            if waited >= self.wait_seconds:
                raise RunEndMessagePendingError(
                    f"the message about run {run}'s end is being sent by another sender (claimed until "
                    f"{end.claimed_until}): try again after that"
                )
            self.sleep(self.poll_seconds)
            waited += self.poll_seconds

    def _send_claimed(
        self, run: str, token: str, send: Callable[[], SentT], message_id: Callable[[SentT], str | None]
    ) -> SentT:
        try:
            sent = send()
        except Exception:
            # Not sent: owed again at once, so that the next try need not wait out the claim.
            self.records.give_back_run_end_message(run, token)
            raise
        if not self.records.run_end_message_sent(run, token, at=self.clock(), message_id=message_id(sent)):
            log.warning(
                "run %s: the claim on its end's message lapsed while it was sent; another sender may send it again",
                run,
            )
        return sent
