"""Which pairs' labels are trusted, and a person's say over it (docs/screening.md, "Earning trust from the start").

Trust belongs to pair contents (`contracts.pair_digest`), never to a batch's name: the ledger keeps
one trust item per batch with a verdict for each pair content judged (`functions/data/ledger_trust.py`).
A run's screening holds the pairs it finds wrong and trusts the ones an independent judgement passed;
`retrain data held` lists what is held, released and the benchmark, and `retrain data release`,
`hold` and `benchmark` change the verdicts on one batch's *current* pairs. A pair added or replaced
later has a content of its own: it is new, and screened, whatever was decided here.

Every change is made by a named person (the caller's identity, `caller_identity`) for a reason
(`ReasonRequiredError` without one, before anything is read), recorded as a `TrustDecision` beside
the screening's, and written over the revision read (`Ledger.update_trust`), so a screening that
records its verdicts meanwhile is never overwritten. A change is refused, with nothing changed, for a
batch the ledger does not know or whose pairs' trust does not allow it (`TrustRefusedError`). The
trigger reads the verdicts when it freezes a dataset version, so a change counts from the next run
on: a run already going keeps the version it froze.

It takes the ledger as an argument and knows nothing of a command line, so the CLI and the tests
call the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel

from functions.common import prefixes
from functions.common.errors import ConcurrentUpdateError, RetrainError
from functions.data.ledger import Ledger
from functions.data.models import BatchTrust, PairStatus, PairToFix, Trust, TrustDecision
from functions.data.reports import NEW, REPORT_MARKDOWN, PairTrustCounts, count_trust, curated_contents
from functions.data.run_lock import RunLock
from retrain.ops.status import utc_now

if TYPE_CHECKING:
    from mypy_boto3_sts import STSClient

OFFER_ATTEMPTS = 5  # reads of a pair the intake keeps changing under a release
# What a benchmark decision says of how its labels were checked (`make_benchmark`).
CHECKED_BY_HAND = "its labels were checked by hand"
SCREENED_AND_TRUSTED = "every pair was screened and passed by an independent judgement (trusted)"
UNDONE = "benchmark undone"  # the verdict of `undo_benchmark`: its pairs are new again

# One line each: what a pair's trust means for the next runs (`retrain data held` and the commands' messages).
MEANINGS: dict[str, str] = {
    Trust.HELD: "left out of every dataset version until its labels are fixed (a new pair) or a person releases it",
    Trust.RELEASED: "held, then let in by a person: trained on, still screened and reported, never held again "
    "automatically",
    Trust.BENCHMARK: "the team's evaluation set: never trained on, always in the quality gate",
    Trust.TRUSTED: "an independent screening passed it: it calibrates the next screening and judges the gate",
    NEW: "no verdict on its content yet: the next run with an accepted model screens it",
}


class TrustRefusedError(RetrainError):
    """A trust change that does not apply to the batch's pairs as they are: nothing changed."""


class ReasonRequiredError(RetrainError):
    """A trust change without a reason (or without a person to record): a usage error, refused
    before anything is read or written."""


class TrustEntry(BaseModel):
    """One batch with pair verdicts, as `retrain data held` lists it."""

    batch: str
    pairs: PairTrustCounts  # its curated pairs as they are now, by trust
    last: TrustDecision | None  # who decided last, when, why (a screening names its run)
    run_report: str | None  # `reports/runs/<run>/` of the newest decision a run made: what screening found
    report: str  # `reports/batches/<batch>/report.md`: the team's view, with the pairs to fix
    to_fix: int  # pairs on its relabel list


class TrustOverview(BaseModel):
    at: datetime
    held: list[TrustEntry]  # batches with held pairs, oldest last decision first
    released: list[TrustEntry]
    benchmark: list[TrustEntry]
    trusted: int  # batches with trusted pairs
    new: int  # batches none of whose current pairs has a verdict


class TrustChange(BaseModel):
    """What a person's command did to one batch."""

    batch: str
    decision: TrustDecision  # the decision recorded: verdict, who, when, why, pair contents changed
    before: PairTrustCounts  # the batch's current pairs, before and after
    after: PairTrustCounts
    running: str | None  # the run holding the retraining lock: it keeps the version it froze
    # A release: the released pairs, offered to the trigger as new data again.
    offered: int = 0


def caller_identity(sts: STSClient) -> str:
    """Who is deciding, as AWS knows them (their ARN): recorded with every trust decision."""
    return sts.get_caller_identity()["Arn"]


def trust_overview(ledger: Ledger, *, clock: Callable[[], datetime] = utc_now) -> TrustOverview:
    """Every batch with held, released or benchmark pairs, oldest last decision first; how many
    batches have trusted pairs, and how many have no verdict at all."""
    trusts = ledger.trusts()
    entries = []
    new = 0
    for batch in ledger.batches():
        contents = curated_contents(ledger.pairs(batch.batch))
        trust = trusts.get(batch.batch)
        counts = count_trust(trust, contents.values())
        if counts.new == counts.total:
            new += 1
        if trust is not None:
            entries.append(_entry(batch.batch, trust, counts))
    entries.sort(key=lambda e: (e.last.at if e.last else clock(), e.batch))
    return TrustOverview(
        at=clock(),
        held=[e for e in entries if e.pairs.held],
        released=[e for e in entries if e.pairs.released],
        benchmark=[e for e in entries if e.pairs.benchmark],
        trusted=sum(1 for e in entries if e.pairs.trusted),
        new=new,
    )


def release_batch(
    ledger: Ledger, batch: str, *, reason: str, by: str, clock: Callable[[], datetime] = utc_now
) -> TrustChange:
    """Let a batch's held pairs in: trained on from the next run on, still screened, never held
    again by a screening. Only its current held pairs (a label replaced since is a new pair)."""
    why, who = _required(reason, by)
    contents = _contents(ledger, batch)
    now = clock()
    released: set[str] = set()

    def release(current: BatchTrust) -> BatchTrust:
        held = {d for d in contents.values() if current.of(d) is Trust.HELD}
        if not held:
            raise TrustRefusedError(f"{batch} has no held pair: its pairs are {_summary(current, contents)}")
        released.clear()
        released.update(held)  # what the last try, the one written, released
        decision = _decision(Trust.RELEASED, who, why, now, len(held))
        return _decided(current, dict.fromkeys(held, Trust.RELEASED), decision, fixed=held)

    change = _change(ledger, batch, contents, release, now)
    return change.model_copy(update={"offered": _offer_again(ledger, batch, now, released)})


def _offer_again(ledger: Ledger, batch: str, now: datetime, released: set[str]) -> int:
    """Make the released pairs new data for the trigger again; how many there are.

    A pair that screening held was frozen into the version of the run that screened it, as new:
    it is marked with that version and its batch consumed, so the trigger would count it no new
    pair, and a release would wait for some other team's drop. No accepted model was trained on
    it, so it is new: unmark it, then bring the batch back (in that order, so the trigger never sees
    the batch back with nothing new in it and consumes it again).
    """
    offered = 0
    for pair in ledger.pairs(batch):
        if pair.status is not PairStatus.VALID or pair.digest not in released:
            continue
        offered += 1
        for _ in range(OFFER_ATTEMPTS):
            found = ledger.pair(batch, pair.stem)
            # A pair the intake changed meanwhile (a new label) is a new pair already: nothing to do.
            if found is None or found[0].status is not PairStatus.VALID or found[0].dataset_version is None:
                break
            if found[0].digest not in released:
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
    return offered


def hold_batch(
    ledger: Ledger, batch: str, *, reason: str, by: str, clock: Callable[[], datetime] = utc_now
) -> TrustChange:
    """A person holds a batch's current pairs: left out of every dataset version frozen from now
    on, whatever their trust was. Pairs added or replaced later are new, and screened. A
    benchmark is never trained on anyway (undo it first)."""
    why, who = _required(reason, by)
    contents = _contents(ledger, batch)
    now = clock()

    def hold(current: BatchTrust) -> BatchTrust:
        if any(current.of(d) is Trust.BENCHMARK for d in contents.values()):
            raise TrustRefusedError(
                f"{batch} holds the team's benchmark: never trained on already; "
                f"`retrain data benchmark {batch} --undo --reason ...` makes its pairs new first"
            )
        targets = {d for d in contents.values() if current.of(d) is not Trust.HELD}
        if not targets:
            last = current.last
            said = f" (last decision: {last.verdict} by {last.by}, {last.at:%Y-%m-%d %H:%M:%S} UTC)" if last else ""
            raise TrustRefusedError(f"every pair of {batch} is held already{said}")
        decision = _decision(Trust.HELD, who, why, now, len(targets))
        return _decided(current, dict.fromkeys(targets, Trust.HELD), decision)

    return _change(ledger, batch, contents, hold, now)


def make_benchmark(
    ledger: Ledger,
    batch: str,
    *,
    reason: str,
    by: str,
    checked_by_hand: bool = False,
    clock: Callable[[], datetime] = utc_now,
) -> TrustChange:
    """Name a batch's current pairs the team's benchmark: evaluation only, in every quality gate.
    Its labels must be right: every pair trusted (screened and passed by an independent judgement),
    or checked by hand, which the decision records. A held pair's labels are in doubt: release it
    first, or purge it."""
    why, who = _required(reason, by)
    contents = _contents(ledger, batch)
    now = clock()

    def name(current: BatchTrust) -> BatchTrust:
        verdicts = [current.of(d) for d in contents.values()]
        if Trust.HELD in verdicts:
            raise TrustRefusedError(
                f"{batch} has held pairs, which cannot judge models: its labels are in doubt: release it first "
                f"(`retrain data release {batch} --reason ...`) if they are right, or purge it"
            )
        targets = {d for d in contents.values() if current.of(d) is not Trust.BENCHMARK}
        if not targets:
            raise TrustRefusedError(f"{batch} is the team's benchmark already")
        unscreened = sum(1 for d in targets if current.of(d) is not Trust.TRUSTED)
        if unscreened and not checked_by_hand:
            raise TrustRefusedError(
                f"{unscreened} of {len(contents)} pairs of {batch} are not trusted "
                f"({_summary(current, contents)}). A benchmark can only be made from screened content or with "
                "an explicit reason that says it was checked by hand (--checked-by-hand)"
            )
        how = CHECKED_BY_HAND if checked_by_hand else SCREENED_AND_TRUSTED
        decision = _decision(Trust.BENCHMARK, who, why, now, len(targets), how)
        return _decided(current, dict.fromkeys(targets, Trust.BENCHMARK), decision)

    return _change(ledger, batch, contents, name, now)


def undo_benchmark(
    ledger: Ledger, batch: str, *, reason: str, by: str, clock: Callable[[], datetime] = utc_now
) -> TrustChange:
    """A batch's benchmark pairs become new again: screened and trained on like any new drop."""
    why, who = _required(reason, by)
    contents = _contents(ledger, batch)
    now = clock()

    def undo(current: BatchTrust) -> BatchTrust:
        # Every benchmark content of the batch, a replaced label's too: the batch is no benchmark now.
        named = {d for d, trust in current.pairs.items() if trust is Trust.BENCHMARK}
        if not named:
            raise TrustRefusedError(f"{batch} is not the team's benchmark: its pairs are {_summary(current, contents)}")
        pairs = {d: trust for d, trust in current.pairs.items() if d not in named}
        decision = _decision(UNDONE, who, why, now, len(named))
        return current.model_copy(update={"pairs": pairs, "decisions": [*current.decisions, decision]})

    return _change(ledger, batch, contents, undo, now)


# ------------------------------------------------------------------ helpers --
def _required(reason: str, by: str) -> tuple[str, str]:
    """The reason and the person, or `ReasonRequiredError`: a decision nobody can explain later
    is not made."""
    if not reason or not reason.strip():
        raise ReasonRequiredError("a trust decision needs a reason (--reason TEXT): it is kept with the decision")
    if not by or not by.strip():
        raise ReasonRequiredError("a trust decision needs the identity of who makes it")
    return reason.strip(), by.strip()


def _contents(ledger: Ledger, batch: str) -> dict[str, str]:
    """The batch's curated pairs now (stem -> digest); `TrustRefusedError` for a batch the ledger
    does not know, or one with nothing curated to decide on."""
    if ledger.batch(batch) is None:
        raise TrustRefusedError(f"there is no batch {batch} in the ledger (`retrain data status` lists them)")
    contents = curated_contents(ledger.pairs(batch))
    if not contents:
        raise TrustRefusedError(f"{batch} has no curated pair to decide on (a pair curated later is new, and screened)")
    return contents


def _decision(verdict: str, by: str, reason: str, now: datetime, pairs: int, *more: str) -> TrustDecision:
    return TrustDecision(verdict=str(verdict), by=by, run=None, at=now, reasons=[reason, *more], pairs=pairs)


def _decided(
    current: BatchTrust, verdicts: dict[str, Trust], decision: TrustDecision, *, fixed: set[str] | None = None
) -> BatchTrust:
    """`current` with `verdicts` and `decision`; the pairs in `fixed` leave the relabel list
    (released: their labels are right)."""
    to_fix: list[PairToFix] = [p for p in current.to_fix if p.digest not in (fixed or set())]
    return current.model_copy(
        update={
            "pairs": {**current.pairs, **verdicts},
            "decisions": [*current.decisions, decision],
            "to_fix": to_fix,
        }
    )


def _change(
    ledger: Ledger,
    batch: str,
    contents: dict[str, str],
    change: Callable[[BatchTrust], BatchTrust],
    now: datetime,
) -> TrustChange:
    """Write `change` over the revision read (it raises `TrustRefusedError` to write nothing)."""
    before: list[BatchTrust] = []

    def recorded(current: BatchTrust) -> BatchTrust:
        before[:] = [current]  # the revision the change was made over (the last try's)
        return change(current)

    written = ledger.update_trust(batch, recorded)
    assert written is not None and written.last is not None, "every change writes a decision"
    # A purge's lease freezes nothing; a run's dataset version was frozen before this change. No
    # state machine to ask here: the lock's rule goes by the lease (functions/data/run_lock.py).
    lock = RunLock(ledger, lambda: now).holder()
    running = lock.holder if lock is not None and not Ledger.is_purge_holder(lock.holder) else None
    return TrustChange(
        batch=batch,
        decision=written.last,
        before=count_trust(before[0], contents.values()),
        after=count_trust(written, contents.values()),
        running=running,
    )


def _summary(trust: BatchTrust, contents: dict[str, str]) -> str:
    return count_trust(trust, contents.values()).summary()


def _entry(batch: str, trust: BatchTrust, counts: PairTrustCounts) -> TrustEntry:
    by_run = next((d for d in reversed(trust.decisions) if d.run), None)
    return TrustEntry(
        batch=batch,
        pairs=counts,
        last=trust.last,
        run_report=prefixes.run_report_key(by_run.run, "") if by_run and by_run.run else None,
        report=prefixes.report_key(batch, REPORT_MARKDOWN),
        to_fix=len(trust.to_fix),
    )
