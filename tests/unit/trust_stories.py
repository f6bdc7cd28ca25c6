"""What the trust tests build on: curated pairs with contents of their own, a label replaced the
way the intake replaces it, and the verdicts a run's screening records. On any ledger (moto's)."""

from __future__ import annotations

import hashlib
from datetime import datetime

from functions.common.contracts import pair_digest
from functions.data.ledger import Ledger
from functions.data.models import (
    BatchStatus,
    BatchTrust,
    PairRecord,
    PairStatus,
    PairToFix,
    Side,
    Trust,
    TrustDecision,
)
from functions.validation import FileCheck, Role


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _side(batch: str, stem: str, role: Role, content: str) -> Side:
    folder, extension = ("images", "jpg") if role is Role.IMAGE else ("labels", "png")
    key = f"incoming/{batch}/{folder}/{stem}.{extension}"
    return Side(key=key, version=content, check=FileCheck(key=key, role=role, size_bytes=100, sha256=sha256(content)))


def curated_pair(batch: str, stem: str, *, label: str, first_seen: datetime) -> PairRecord:
    """A pair the intake curated: its image's and label's bytes stand for `<batch>/<stem>` and `label`."""
    image, drawn = _side(batch, stem, Role.IMAGE, f"{batch}/{stem}"), _side(batch, stem, Role.LABEL, label)
    return PairRecord(
        batch=batch,
        stem=stem,
        status=PairStatus.VALID,
        image=image,
        label=drawn,
        first_seen=first_seen,
        image_destination=f"dataset/images/{batch}/{stem}.jpg",
        image_destination_version="1",
        label_destination=f"dataset/labels/{batch}/{stem}.png",
        label_destination_version=label,
    )


def digest(pair: PairRecord) -> str:
    assert pair.image is not None and pair.label is not None
    assert pair.image.check.sha256 is not None and pair.label.check.sha256 is not None
    return pair_digest(pair.image.check.sha256, pair.label.check.sha256)


def curate(ledger: Ledger, batch: str, stems: list[str], *, at: datetime, closed: bool = True) -> dict[str, str]:
    """A drop the intake curated (and closed, by its marker): stem -> pair content."""
    ledger.touch_batch(batch, at)
    contents = {}
    for stem in stems:
        pair = curated_pair(batch, stem, label=f"{batch}/{stem}: first labels", first_seen=at)
        ledger.put_pair(pair, 1)
        contents[stem] = digest(pair)
    if closed:
        found = ledger.batch(batch)
        assert found is not None
        record, revision = found
        ledger.close_batch(record.model_copy(update={"status": BatchStatus.CLOSED, "closed_at": at}), revision)
    return contents


def relabel(ledger: Ledger, batch: str, stem: str, label: str, *, at: datetime) -> str:
    """The team uploads a corrected label: the pair's content changes, it is new data again, and
    its batch comes back to the trigger (as the intake does). The new pair content."""
    found = ledger.pair(batch, stem)
    assert found is not None, f"{batch}/{stem} was never curated"
    record, revision = found
    fixed = curated_pair(batch, stem, label=label, first_seen=record.first_seen)
    ledger.put_pair(fixed, revision + 1)
    ledger.touch_batch(batch, at)
    return digest(fixed)


def freeze(ledger: Ledger, batch: str, version: str) -> None:
    """What the trigger does to a batch's new pairs when a run's version takes them in."""
    for pair in ledger.pairs(batch):
        found = ledger.pair(batch, pair.stem)
        assert found is not None
        ledger.put_pair(found[0].model_copy(update={"dataset_version": version}), found[1] + 1)
    closed = {record.batch: (record, revision) for record, revision in ledger.closed_batches()}
    assert ledger.consume_batch(*closed[batch]), f"{batch} was not consumed"


def screened(
    ledger: Ledger,
    batch: str,
    verdicts: dict[str, Trust],
    *,
    run: str,
    at: datetime,
    reasons: tuple[str, ...] = (),
    to_fix: dict[str, str] | None = None,
) -> None:
    """What a run's evaluation records for the pair contents its screening judged; `to_fix`
    (stem -> content) replaces the batch's relabel list, worst first."""
    verdict = "held" if Trust.HELD in verdicts.values() else "ok"
    decision = TrustDecision(
        verdict=verdict, by=f"run {run}'s screening", run=run, at=at, reasons=list(reasons), pairs=len(verdicts)
    )
    fix = [
        PairToFix(
            image=f"images/{batch}/{stem}.jpg",
            label=f"labels/{batch}/{stem}.png",
            digest=content,
            why="labelled sidewalk where the model sees road",
            quality=0.1,
            picture=f"fix/{number}.png",
            run=run,
        )
        for number, (stem, content) in enumerate((to_fix or {}).items(), start=1)
    ]

    def record(current: BatchTrust) -> BatchTrust:
        return current.model_copy(
            update={
                "pairs": {**current.pairs, **verdicts},
                "decisions": [*current.decisions, decision],
                "to_fix": fix or current.to_fix,
            }
        )

    ledger.update_trust(batch, record)
