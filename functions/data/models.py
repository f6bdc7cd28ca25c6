"""What the ledger holds: batches, pairs, the fate of every uploaded object version, the lock.

Every record of a batch lives under one partition (`batch#<batch>`), so a batch's report is one
query. A sparse index (`state_pk`, `state_sk`) lists what the sweeper and the trigger look for:
open batches by last activity, closed batches waiting for a run, pending pairs by age, and the
curated pairs that make up the next dataset version.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from functions.common.contracts import PictureMode, pair_digest
from functions.validation import FileCheck, Reason, Role


class FileStatus(StrEnum):
    """The one fate every uploaded object version ends in (docs/intake.md)."""

    PENDING = "pending"  # valid on its own, waiting for its partner
    CURATED = "curated"
    QUARANTINED = "quarantined"
    DUPLICATE = "duplicate"
    SUPERSEDED = "superseded"
    MARKER = "marker"  # the batch's _COMPLETE marker: consumed, nothing to keep
    # Rejected, but left in incoming/ untouched (its `.reason.json` is in quarantine/): too large
    # to copy within the function's time, or encrypted with a key the intake cannot use.
    REFUSED = "refused"


class PairStatus(StrEnum):
    PENDING = "pending"
    JUDGING = "judging"
    VALID = "valid"
    INVALID = "invalid"
    DUPLICATE = "duplicate"
    INCOMPLETE = "incomplete"


class BatchStatus(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class FileRecord(BaseModel):
    """One object version and what became of it."""

    model_config = ConfigDict(frozen=True)

    batch: str
    key: str  # the landing-zone key
    version: str  # S3 VersionId, or the ETag where the event carried none
    status: FileStatus
    role: Role | None = None
    stem: str | None = None
    sha256: str | None = None
    reasons: tuple[Reason, ...] = ()
    destination: str | None = None  # where it was copied: dataset/... or quarantine/...
    destination_version: str | None = None
    duplicate_of: str | None = None
    reason_key: str | None = None  # refused: where its .reason.json is (the file stays in incoming/)
    recorded_at: datetime


class Side(BaseModel):
    """One file of a pair as the pair item keeps it until both are there."""

    model_config = ConfigDict(frozen=True)

    key: str
    version: str
    check: FileCheck
    sequencer: str | None = None  # S3's order of this key's events: an older version never wins


class PairRecord(BaseModel):
    batch: str
    stem: str
    status: PairStatus = PairStatus.PENDING
    image: Side | None = None
    label: Side | None = None
    first_seen: datetime
    class_pixels: dict[str, int] = Field(default_factory=dict)
    image_destination: str | None = None
    image_destination_version: str | None = None
    label_destination: str | None = None
    label_destination_version: str | None = None
    # The first version that included this pair; None again when its batch is released (a held
    # batch's pairs were in the screening run's version, but no model was trained on them).
    dataset_version: str | None = None
    duplicate_of: str | None = None

    def side(self, role: Role) -> Side | None:
        return self.image if role is Role.IMAGE else self.label

    @property
    def digest(self) -> str | None:
        """The content its trust is kept under (`contracts.pair_digest`); None while a side lacks
        its sha256 (a pair not yet complete)."""
        if self.image is None or self.label is None:
            return None
        if self.image.check.sha256 is None or self.label.check.sha256 is None:
            return None
        return pair_digest(self.image.check.sha256, self.label.check.sha256)


class BatchRecord(BaseModel):
    batch: str
    status: BatchStatus = BatchStatus.OPEN
    first_seen: datetime
    last_seen: datetime
    closed_at: datetime | None = None
    close_reason: str | None = None


class Trust(StrEnum):
    """How far one pair's labels are trusted (docs/screening.md, "Earning trust from the start"), for its content:
    a pair without a verdict for its digest is new, whatever its batch's other pairs are."""

    TRUSTED = "trusted"  # an independent screening passed it: it judges the gate and calibrates screening
    HELD = "held"  # screening (or a person) found its labels wrong: in no version until fixed or released
    RELEASED = "released"  # held, then let in by a named person: trained on, screened, never held again
    BENCHMARK = "benchmark"  # a person named it the evaluation set: never trained on, always in the gate


class TrustDecision(BaseModel):
    """One decision over a batch's pairs: who, when, why, over how many pair contents."""

    model_config = ConfigDict(frozen=True)

    verdict: str  # a screening's verdict (held, pairs left out, disputed, ...) or a person's (released, ...)
    by: str  # a person's identity (the caller's ARN, from STS) or "run <run>'s screening"
    run: str | None = None
    at: datetime
    reasons: list[str] = Field(default_factory=list)
    pairs: int = Field(default=0, ge=0)  # the pair contents it decided on


class PairToFix(BaseModel):
    """One pair on its team's relabel list, worst first."""

    model_config = ConfigDict(frozen=True)

    image: str
    label: str
    digest: str
    why: str  # "labelled sidewalk where the model sees person (120 pixels)"
    quality: float  # the label-quality score (soft-minimum self-confidence; lower is worse)
    picture: str | None = None  # its picture beside the batch report (`fix/<n>.png`), if it has one
    run: str


class BatchTrust(BaseModel):
    """Every pair verdict of one batch, keyed by pair content (`contracts.pair_digest`), with the
    decisions that made them and the team's relabel list. Trust is never inherited: a pair added to
    the batch, or replaced, has a digest of its own, and is new."""

    batch: str
    pairs: dict[str, Trust] = Field(default_factory=dict)
    decisions: list[TrustDecision] = Field(default_factory=list)  # newest last, the last DECISIONS_KEPT
    to_fix: list[PairToFix] = Field(default_factory=list)
    # How the relabel list's pictures were made (the last screening's HeldPairPictures).
    pictures: PictureMode = "show"

    def of(self, digest: str) -> Trust | None:
        return self.pairs.get(digest)

    def count(self, trust: Trust) -> int:
        return sum(1 for verdict in self.pairs.values() if verdict is trust)

    @property
    def last(self) -> TrustDecision | None:
        return self.decisions[-1] if self.decisions else None


class LockRecord(BaseModel):
    """The run lock's item. The holder is a run's name (its execution's) or a purge's; a run's
    dataset version is its own field: a rerun (`<version>-rerun-<time>`) trains on an older
    version under a new name, and the name may cut the version short."""

    holder: str
    acquired_at: datetime
    expires_at: datetime
    dataset_version: str | None = None  # a run's; None for a purge (and for locks written before)


class RunEndMessage(StrEnum):
    """Where the one message about a run's end stands (`functions/notify/once.py`)."""

    OWED = "owed"  # nobody is sending it: the next sender claims it
    SENDING = "sending"  # claimed by one sender, until its claim lapses
    SENT = "sent"  # nobody sends it again


class RunEnd(BaseModel):
    """A run's end, recorded by whoever freed the run's lock owing the team its message: written in
    the same transaction as the release, so there is one per run end, and it exists exactly when
    a releaser that still had to tell freed the lock (`ledger_run_ends.py`)."""

    run: str
    freed_by: str  # who freed the lock, and why (the release's source)
    freed_at: datetime
    message: RunEndMessage = RunEndMessage.OWED
    claimed_until: datetime | None = None  # while SENDING: when the claim lapses
    sent_at: datetime | None = None
    message_id: str | None = None  # the SNS message that told the team


class ObjectVersion(BaseModel):
    """One version (or delete marker) of an object in the versioned data bucket."""

    key: str
    version_id: str
    delete_marker: bool = False
    latest: bool = False


class WaitingJob(BaseModel):
    """A run waiting for its training job to end: the Step Functions task token its wait state
    handed out, kept until the job's end is sent back (by its event, or by the safety poll)."""

    job_name: str
    execution: str
    token: str = Field(min_length=1, max_length=1024)
    run: dict[str, Any]  # the run's RunContext, as the state machine passed it
    job: dict[str, Any]  # the JobState of the wait's start
    since: datetime
