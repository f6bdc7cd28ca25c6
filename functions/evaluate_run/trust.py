"""What a run's screening means for its pairs' trust (docs/screening.md).

The trainer judged every new pair with the accepted model (`screening.json`); this records the
verdicts in the ledger, per pair content: the pairs it left out and the held batches' pairs are
`held` (in no version until their team fixes them, which makes a new pair, or a person releases
them), and the pairs an *independent* judgement passed are `trusted` (they calibrate the next
screening and judge the next gate). Trust comes from that judgement, not from the gate's verdict
on the candidate and never from being first. A person's decision stands: a released, trusted or
benchmark pair is never held by a screening. Each screened batch's relabel list is replaced by
this run's, with its pictures copied beside the batch report, which is rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from functions.common import prefixes
from functions.common.contracts import PictureMode, pair_digest
from functions.data.ledger import Ledger
from functions.data.models import BatchTrust, PairToFix, Trust, TrustDecision
from functions.data.reports import write_report
from functions.data.storage import DataBucket

SCREENING_MEMBER = "screening.json"
HELD_VERDICTS = frozenset({"held", "left out"})
TO_FIX_KEPT = 200  # the relabel list's length in the ledger (the run's screening.json has them all)


class ScreenedPair(BaseModel):
    model_config = ConfigDict(extra="allow")

    image: str
    label: str
    image_sha256: str
    label_sha256: str
    verdict: str  # passed | left out | held | not judged | released
    contradicted: bool = False
    quality: float = 1.0
    confusion: str = ""
    picture: str | None = None

    @property
    def digest(self) -> str:
        return pair_digest(self.image_sha256, self.label_sha256)


class ScreenedBatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    team: str = ""
    verdict: str
    held: bool = False
    independent: bool = False
    pair_count: int = Field(default=0, ge=0)
    judged: int = Field(default=0, ge=0)
    contradicted: int = Field(default=0, ge=0)
    share: float = Field(default=0.0, ge=0.0, le=1.0)
    reasons: list[str] = Field(default_factory=list)
    pairs: list[ScreenedPair] = Field(default_factory=list)

    def to_fix(self) -> list[ScreenedPair]:
        """Its pairs to relabel, worst first (the trainer wrote them in that order)."""
        return [p for p in self.pairs if p.verdict in HELD_VERDICTS or (p.contradicted and p.verdict != "released")]


class ScreeningFile(BaseModel):
    """`screening.json` as the trainer writes it (trainer/screening/phase.py), as much as is read here."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 2
    model: str
    held: list[str] = Field(default_factory=list)
    disputed: list[str] = Field(default_factory=list)
    outvoted: list[str] = Field(default_factory=list)
    corroborated_by: list[str] = Field(default_factory=list)
    batches: dict[str, ScreenedBatch] = Field(default_factory=dict)
    pictures: PictureMode = "show"  # trainers before HeldPairPictures pictured the pairs as they are

    def pictured(self) -> set[str]:
        return {p.picture for b in self.batches.values() for p in b.pairs if p.picture}


class TrustChanges(BaseModel):
    held: dict[str, list[str]] = Field(default_factory=dict)  # batch -> why (whole batches held)
    left_out: dict[str, int] = Field(default_factory=dict)  # batch -> pairs left out to fix
    disputed: dict[str, list[str]] = Field(default_factory=dict)
    not_judged: list[str] = Field(default_factory=list)
    trusted: dict[str, int] = Field(default_factory=dict)  # batch -> pairs that earned trust


@dataclass(frozen=True)
class TrustKeeper:
    ledger: Ledger
    bucket: DataBucket

    def record(
        self, run: str, screening: ScreeningFile | None, *, pictures: Mapping[str, bytes], now: datetime
    ) -> TrustChanges:
        """Record every screened batch's verdicts; `pictures` are the run's output files by name."""
        changes = TrustChanges()
        for name, batch in sorted((screening.batches if screening else {}).items()):
            to_fix = self._fix_list(run, name, batch, pictures)
            decision = TrustDecision(
                verdict=batch.verdict,
                by=f"run {run}'s screening",
                run=run,
                at=now,
                reasons=batch.reasons,
                pairs=len(batch.pairs),
            )
            held = {p.digest for p in batch.pairs if p.verdict in HELD_VERDICTS}
            passed = {p.digest for p in batch.pairs if p.verdict == "passed"} if batch.independent else set()
            mode = screening.pictures if screening else "show"
            written = self.ledger.update_trust(name, _apply(held, passed, decision, to_fix, mode))
            counts = written or BatchTrust(batch=name)
            if batch.held:
                changes.held[name] = batch.reasons
            elif held:
                changes.left_out[name] = len(held & {d for d, t in counts.pairs.items() if t is Trust.HELD})
            if batch.verdict == "disputed":
                changes.disputed[name] = batch.reasons
            if batch.verdict == "not judged":
                changes.not_judged.append(name)
            if passed:
                changes.trusted[name] = len(passed & {d for d, t in counts.pairs.items() if t is Trust.TRUSTED})
            write_report(name, self.ledger, self.bucket)
        return changes

    def _fix_list(
        self, run: str, batch: str, screened: ScreenedBatch, pictures: Mapping[str, bytes]
    ) -> list[PairToFix]:
        """The batch's relabel list, its pictures copied beside its report (`fix/<n>.png`)."""
        found = []
        for number, pair in enumerate(screened.to_fix()[:TO_FIX_KEPT], start=1):
            picture = None
            if pair.picture and pair.picture in pictures:
                picture = f"fix/{number}.png"
                self.bucket.put_bytes(prefixes.report_key(batch, picture), pictures[pair.picture], "image/png")
            found.append(
                PairToFix(
                    image=pair.image,
                    label=pair.label,
                    digest=pair.digest,
                    why=pair.confusion or "contradicted by the accepted model",
                    quality=pair.quality,
                    picture=picture,
                    run=run,
                )
            )
        return found


def _apply(
    held: set[str], passed: set[str], decision: TrustDecision, to_fix: list[PairToFix], pictures: PictureMode
) -> Callable[[BatchTrust], BatchTrust]:
    def change(current: BatchTrust) -> BatchTrust:
        pairs = dict(current.pairs)
        for digest in held:
            # A person's decision stands, and so does an independent judgement made before.
            if pairs.get(digest) not in {Trust.RELEASED, Trust.BENCHMARK, Trust.TRUSTED}:
                pairs[digest] = Trust.HELD
        for digest in passed:
            pairs.setdefault(digest, Trust.TRUSTED)
        # A retried evaluation replaces its own decision rather than adding it twice.
        decisions = [*(d for d in current.decisions if d.run != decision.run), decision]
        return current.model_copy(
            update={"pairs": pairs, "decisions": decisions, "to_fix": to_fix, "pictures": pictures}
        )

    return change
