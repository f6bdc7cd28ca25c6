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

from functions.validation import FileCheck, Reason, Role


class FileStatus(StrEnum):
    """The one fate every uploaded object version ends in (DESIGN.md section 3)."""

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


class BatchRecord(BaseModel):
    batch: str
    status: BatchStatus = BatchStatus.OPEN
    first_seen: datetime
    last_seen: datetime
    closed_at: datetime | None = None
    close_reason: str | None = None


class Trust(StrEnum):
    """How far a batch's labels are trusted (DESIGN.md section 3, data trust). A batch without a
    trust record is new: screened by the next run that has an accepted model."""

    TRUSTED = "trusted"  # an accepted run trained on it: its validation pairs judge the gate
    HELD = "held"  # screening found the accepted model confidently contradicts it: in no version
    RELEASED = "released"  # held, then let in by an operator: trained on, screened, never held again
    BENCHMARK = "benchmark"  # the team's evaluation set: never trained on, always in the gate


class TrustRecord(BaseModel):
    """A batch's trust, who set it and why (`retrain data held` shows these)."""

    batch: str
    trust: Trust
    reasons: list[str] = Field(default_factory=list)
    run: str | None = None  # the run whose screening held it, or whose acceptance trusted it
    by: str  # "screening", "the gate", or "operator"
    at: datetime


class LockRecord(BaseModel):
    holder: str
    acquired_at: datetime
    expires_at: datetime


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
