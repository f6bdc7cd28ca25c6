"""What a run's screening and its verdict mean for the batches' trust (DESIGN.md section 3).

The trainer screens the version's new batches with the accepted model and names those it holds
(`screening.json`); holding is screening's decision, whatever the gate says of the model, and it
never overrides an operator's release (`Ledger.hold` is conditional). An accepted run's batches
earn trust: their validation pairs join the set the next gate judges on. Each held batch's report
is rewritten, so the annotation team reads why in the same place as every other fate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from functions.data.ledger import Ledger
from functions.data.models import Trust, TrustRecord
from functions.data.reports import write_report
from functions.data.storage import DataBucket

SCREENING_MEMBER = "screening.json"


class ScreenedBatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    trust: str
    pairs: int = Field(ge=0)
    share: float = Field(ge=0.0, le=1.0)
    held: bool = False
    reasons: list[str] = Field(default_factory=list)


class ScreeningFile(BaseModel):
    """`screening.json` as the trainer writes it (trainer/screening/phase.py), as much as is read here."""

    model_config = ConfigDict(extra="allow")

    model: str
    calibration: str
    held: list[str] = Field(default_factory=list)
    batches: dict[str, ScreenedBatch] = Field(default_factory=dict)


class TrustChanges(BaseModel):
    held: dict[str, list[str]] = Field(default_factory=dict)  # batch -> why
    trusted: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class TrustKeeper:
    ledger: Ledger
    bucket: DataBucket

    def record(
        self, run: str, screening: ScreeningFile | None, *, accepted: bool, trained: Iterable[str], now: datetime
    ) -> TrustChanges:
        changes = TrustChanges()
        for name in screening.held if screening else []:
            reasons = screening.batches[name].reasons if screening and name in screening.batches else []
            record = TrustRecord(batch=name, trust=Trust.HELD, reasons=reasons, run=run, by="screening", at=now)
            if self.ledger.hold(record):
                changes.held[name] = reasons
                write_report(name, self.ledger, self.bucket)
        if accepted:
            why = [f"an accepted run, {run}, trained on it"]
            candidates = sorted(set(trained) - set(changes.held))
            records = [
                TrustRecord(batch=name, trust=Trust.TRUSTED, reasons=why, run=run, by="the gate", at=now)
                for name in candidates
            ]
            changes.trusted = self.ledger.trust_batches(records)
        return changes
