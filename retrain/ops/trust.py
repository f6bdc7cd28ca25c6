"""Which batches' labels are trusted, and an operator's say over it (DESIGN.md section 3, data trust).

`retrain data held` lists the batches a run's screening (or an operator) held, those an operator
released, and the team's benchmark; `retrain data release`, `hold` and `benchmark` change one
batch's trust. The ledger keeps one trust record per batch that is not simply new
(`functions/data/ledger_trust.py`); the trigger reads them when it freezes a dataset version, so a
change counts from the next run on: a run already going keeps the version it froze.

An operator's decision is written unconditionally (`Ledger.set_trust`): it stands against
screening, whose holds are conditional. Each change is refused, with nothing changed, for a batch
the ledger does not know or one whose trust does not allow it (`TrustRefusedError`).
It takes the ledger as an argument and knows nothing of a command line, so the CLI and the tests
call the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from pydantic import BaseModel

from functions.common import prefixes
from functions.common.errors import ConcurrentUpdateError, RetrainError
from functions.data.ledger import Ledger
from functions.data.models import PairStatus, Trust, TrustRecord
from retrain.ops.status import utc_now

OPERATOR = "operator"
OFFER_ATTEMPTS = 5  # reads of a pair the intake keeps changing under a release
NEW = "new"  # no trust record: what the status and the messages call such a batch

# One line each: what the trust means for the next runs (`retrain data held` and the refusals).
MEANINGS: dict[str, str] = {
    Trust.HELD: "left out of every dataset version until released or purged",
    Trust.RELEASED: "held, then let in by an operator: trained on, still screened and reported, "
    "never held again automatically",
    Trust.BENCHMARK: "the team's evaluation set: never trained on, always in the quality gate",
    Trust.TRUSTED: "an accepted run trained on it: its validation pairs judge the quality gate",
    NEW: "no accepted run has trained on it yet: the next run with an accepted model screens it",
}


class TrustRefusedError(RetrainError):
    """An operator's trust change that does not apply to the batch as it is: nothing changed."""


class TrustEntry(BaseModel):
    """One batch with a trust record, as `retrain data held` lists it."""

    batch: str
    trust: Trust
    by: str  # "screening" or "operator" (who held, released or named it)
    run: str | None  # the run whose screening held it (kept when an operator releases it)
    at: datetime
    reasons: list[str]
    pairs: int  # its curated pairs: what a held batch keeps out of every version
    run_report: str | None  # `reports/runs/<run>/`: the run's report shows what screening found


class TrustOverview(BaseModel):
    at: datetime
    held: list[TrustEntry]
    released: list[TrustEntry]
    benchmark: list[TrustEntry]
    trusted: int  # batches an accepted run trained on
    new: int  # batches without a trust record


class TrustChange(BaseModel):
    """What an operator's command did to one batch."""

    batch: str
    before: str  # a `Trust` value, or "new"
    after: str
    record: TrustRecord | None  # the record written; None once it is forgotten (a new batch again)
    running: str | None  # the run holding the retraining lock: it keeps the version it froze
    # A release: the batch's curated pairs, offered to the trigger as new data again.
    offered: int = 0


def who(by: str, run: str | None) -> str:
    """`run <run>'s screening`, or `operator`: who made a trust decision."""
    return f"run {run}'s {by}" if run and by != OPERATOR else by


def describe(trust: Trust | str | None) -> str:
    """`held (left out of every ...)`: a trust with its meaning, for messages."""
    name = NEW if trust is None else str(trust)
    return f"{name} ({MEANINGS[name]})"


def trust_overview(ledger: Ledger, *, clock: Callable[[], datetime] = utc_now) -> TrustOverview:
    """Every batch that is held, released or the benchmark, oldest decision first; how many are
    trusted and new."""
    records = ledger.trusts()
    names = {batch.batch for batch in ledger.batches()}

    def entries(trust: Trust) -> list[TrustEntry]:
        found = sorted((r for r in records.values() if r.trust is trust), key=lambda r: (r.at, r.batch))
        return [_entry(ledger, record) for record in found]

    return TrustOverview(
        at=clock(),
        held=entries(Trust.HELD),
        released=entries(Trust.RELEASED),
        benchmark=entries(Trust.BENCHMARK),
        trusted=sum(record.trust is Trust.TRUSTED for record in records.values()),
        new=len(names - records.keys()),
    )


def release_batch(
    ledger: Ledger, batch: str, *, reason: str | None = None, clock: Callable[[], datetime] = utc_now
) -> TrustChange:
    """Let a held batch in: trained on from the next run on, still screened, never held again by
    screening. Only a held batch can be released."""
    current = _current(ledger, batch)
    if current is None or current.trust is not Trust.HELD:
        raise TrustRefusedError(f"{batch} is not held: it is {describe(current.trust if current else None)}")
    record = TrustRecord(
        batch=batch,
        trust=Trust.RELEASED,
        # Why it was held stays beside why it was let in: the next reader sees both sides.
        reasons=[*_given(reason), *(f"held: {why}" for why in current.reasons)],
        run=current.run,
        by=OPERATOR,
        at=clock(),
    )
    ledger.set_trust(record)
    offered = _offer_again(ledger, batch, record.at)
    return _change(ledger, batch, current, record, record.at).model_copy(update={"offered": offered})


def _offer_again(ledger: Ledger, batch: str, now: datetime) -> int:
    """Make a released batch's curated pairs new data for the trigger again; how many there are.

    A batch that screening held was frozen into the version of the run that screened it, as new:
    its pairs are marked with that version and the batch consumed, so the trigger would count
    none of them new, and a release would wait for some other team's drop. No accepted model
    was trained on them, so they are new: unmark them, then bring the batch back (in that order,
    so the trigger never sees the batch back with nothing new in it and consumes it again).
    """
    curated = 0
    for pair in ledger.pairs(batch):
        if pair.status is not PairStatus.VALID:
            continue
        curated += 1
        for _ in range(OFFER_ATTEMPTS):
            found = ledger.pair(batch, pair.stem)
            if found is None or found[0].status is not PairStatus.VALID or found[0].dataset_version is None:
                break
            record, revision = found
            try:
                ledger.put_pair(record.model_copy(update={"dataset_version": None}), revision + 1)
                break
            except ConcurrentUpdateError:
                continue  # the intake changed the pair meanwhile (a new label): look again
        else:
            raise ConcurrentUpdateError(f"pair {batch}/{pair.stem} kept changing: run the release again")
    ledger.touch_batch(batch, now)
    return curated


def hold_batch(
    ledger: Ledger, batch: str, *, reason: str | None = None, clock: Callable[[], datetime] = utc_now
) -> TrustChange:
    """An operator holds a batch by hand: left out of every dataset version frozen from now on.
    A benchmark is never trained on anyway (turn it back first), and a held batch stays held."""
    current = _current(ledger, batch)
    if current is not None and current.trust is Trust.HELD:
        raise TrustRefusedError(
            f"{batch} is held already (by {who(current.by, current.run)}, {current.at:%Y-%m-%d %H:%M:%S} UTC)"
        )
    if current is not None and current.trust is Trust.BENCHMARK:
        raise TrustRefusedError(
            f"{batch} is the team's benchmark: never trained on already; "
            f"`retrain data benchmark {batch} --undo` makes it a new batch first"
        )
    record = TrustRecord(batch=batch, trust=Trust.HELD, reasons=_given(reason), by=OPERATOR, at=clock())
    ledger.set_trust(record)
    return _change(ledger, batch, current, record, record.at)


def make_benchmark(ledger: Ledger, batch: str, *, clock: Callable[[], datetime] = utc_now) -> TrustChange:
    """Name a batch part of the team's benchmark: evaluation only, in every quality gate. A held
    batch's labels are in doubt: it is released first, or purged."""
    current = _current(ledger, batch)
    if current is not None and current.trust is Trust.HELD:
        raise TrustRefusedError(
            f"{batch} is held: its labels are in doubt, so it cannot judge models; "
            f"release it first (`retrain data release {batch}`) if they are right"
        )
    if current is not None and current.trust is Trust.BENCHMARK:
        raise TrustRefusedError(f"{batch} is the team's benchmark already")
    record = TrustRecord(batch=batch, trust=Trust.BENCHMARK, by=OPERATOR, at=clock())
    ledger.set_trust(record)
    return _change(ledger, batch, current, record, record.at)


def undo_benchmark(ledger: Ledger, batch: str, *, clock: Callable[[], datetime] = utc_now) -> TrustChange:
    """A benchmark batch becomes a new batch again: screened and trained on like any new drop."""
    current = _current(ledger, batch)
    if current is None or current.trust is not Trust.BENCHMARK:
        raise TrustRefusedError(
            f"{batch} is not the team's benchmark: it is {describe(current.trust if current else None)}"
        )
    ledger.forget_trust(batch)
    return _change(ledger, batch, current, None, clock())


def _current(ledger: Ledger, batch: str) -> TrustRecord | None:
    """The batch's trust record (None: new); `TrustRefusedError` for a batch the ledger does not know."""
    if ledger.batch(batch) is None:
        raise TrustRefusedError(f"there is no batch {batch} in the ledger (`retrain data status` lists them)")
    return ledger.trust(batch)


def _given(reason: str | None) -> list[str]:
    return [reason.strip()] if reason and reason.strip() else []


def _change(
    ledger: Ledger, batch: str, before: TrustRecord | None, after: TrustRecord | None, now: datetime
) -> TrustChange:
    lock = ledger.lock()
    # A purge's lease freezes nothing; a run's dataset version was frozen before this change.
    running = None
    if lock is not None and now < lock.expires_at and not Ledger.is_purge_holder(lock.holder):
        running = lock.holder
    return TrustChange(
        batch=batch,
        before=before.trust.value if before is not None else NEW,
        after=after.trust.value if after is not None else NEW,
        record=after,
        running=running,
    )


def _entry(ledger: Ledger, record: TrustRecord) -> TrustEntry:
    return TrustEntry(
        batch=record.batch,
        trust=record.trust,
        by=record.by,
        run=record.run,
        at=record.at,
        reasons=record.reasons,
        pairs=sum(pair.status is PairStatus.VALID for pair in ledger.pairs(record.batch)),
        run_report=prefixes.run_report_key(record.run, "") if record.run else None,
    )
