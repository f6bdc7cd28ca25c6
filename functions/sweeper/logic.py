"""The sweeper, on its schedule: close batches that went quiet, and give up on lone files.

A batch with no `_COMPLETE` marker closes once nothing has arrived in it for `quiet_for`; a file
whose partner has not come within `incomplete_after` of its first arrival is quarantined as
`missing_label` or `missing_image` (its pair becomes `incomplete`). When batches close, their
reports are written and the trigger is asked to look.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pydantic import BaseModel

from functions.data.fates import Bookkeeper
from functions.data.models import PairRecord, PairStatus
from functions.validation import Reason, ReasonCode, Role


class SweepResult(BaseModel):
    """What one sweep did."""

    closed: list[str]  # batches closed after their quiet period
    incomplete: int  # pairs given up on: the lone file quarantined as missing its partner
    reported: list[str]  # closed batches whose report was (re)written


@dataclass(kw_only=True)
class Sweeper(Bookkeeper):
    quiet_for: timedelta
    incomplete_after: timedelta

    def sweep(self) -> SweepResult:
        """Close batches quiet for `quiet_for`; give up on files alone for `incomplete_after`."""
        now = self.clock()
        for batch in self.ledger.open_batches_quiet_since(now - self.quiet_for):
            self._close(batch.batch, "quiet period")
        stale = self.ledger.pending_pairs_seen_before(now - self.incomplete_after)
        for pair in stale:
            self.expire(pair)
        result = SweepResult(closed=sorted(self.newly_closed), incomplete=len(stale), reported=self.report_closed())
        if result.closed:
            self.kick("quiet batches closed")
        return result

    def expire(self, pair: PairRecord) -> None:
        """Quarantine the lone file of a pair whose partner never came (`incomplete`)."""
        found = self.ledger.pair(pair.batch, pair.stem)
        if found is None or found[0].status is not PairStatus.PENDING:
            return  # judged since the sweeper looked
        pair, revision = found
        for role, side in ((Role.IMAGE, pair.image), (Role.LABEL, pair.label)):
            if side is None:
                continue
            code = ReasonCode.MISSING_LABEL if role is Role.IMAGE else ReasonCode.MISSING_IMAGE
            partner = "label" if role is Role.IMAGE else "image"
            reason = Reason(
                code=code,
                message=(f"no {partner} arrived for {side.check.key} since {pair.first_seen:%Y-%m-%d %H:%M} UTC"),
                key=side.check.key,
            )
            self._quarantine(pair.batch, side.key, side.version, [reason], role=role, check=side.check)
        self.ledger.put_pair(pair.model_copy(update={"status": PairStatus.INCOMPLETE}), revision + 1)
        self.touched.add(pair.batch)
