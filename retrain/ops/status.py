"""What the ledger and the bucket hold: the overview an engineer asks for.

Batches, their outcomes and their pairs' trust (per pair content: "new", "held", "3 held, 40
trusted"), pairs waiting for a partner, the retraining
lock, the newest dataset versions. It takes its clients as arguments and knows nothing of a
command line, so the CLI and the tests call the same code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from functions.common import prefixes
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus
from functions.data.reports import count_trust, curated_contents

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def utc_now() -> datetime:
    return datetime.now(UTC)


class BatchSummary(BaseModel):
    batch: str
    status: BatchStatus
    # How far its curated pairs' labels are trusted, per pair content: "new", "held", or a mix
    # with counts ("3 held, 40 trusted"); `retrain data held` says who decided and why.
    trust: str = "new"
    closed_by: str | None
    first_seen: datetime
    last_seen: datetime
    closed_at: datetime | None
    files: dict[str, int]  # object versions by fate (curated, quarantined, ...)
    pairs: dict[str, int]  # pairs by status (valid, invalid, ...)


class PendingPair(BaseModel):
    batch: str
    stem: str
    first_seen: datetime
    waiting_for: str  # "image" or "label"


class LockStatus(BaseModel):
    holder: str  # the dataset version, which is also the execution's name
    acquired_at: datetime
    expires_at: datetime
    expired: bool


class DatasetVersionSummary(BaseModel):
    version: str
    key: str
    last_modified: datetime
    size_bytes: int
    purged: bool  # entries were erased from it: `<version>.purged.json` lists them


class DataStatus(BaseModel):
    at: datetime
    batch_count: int
    batches: list[BatchSummary]  # the most recently active first
    pending_pairs: list[PendingPair]
    lock: LockStatus | None
    dataset_version_count: int
    dataset_versions: list[DatasetVersionSummary]  # the newest first


def data_status(
    ledger: Ledger,
    s3: S3Client,
    bucket: str,
    *,
    batches: int = 20,
    versions: int = 5,
    clock: Callable[[], datetime] = utc_now,
) -> DataStatus:
    """The overview; `batches` and `versions` bound how many are listed (0: all)."""
    now = clock()
    records = sorted(ledger.batches(), key=lambda b: (b.last_seen, b.batch), reverse=True)
    shown = records[:batches] if batches else records
    trusts = ledger.trusts()
    summaries = []
    for record in shown:
        pairs = ledger.pairs(record.batch)
        summaries.append(
            BatchSummary(
                batch=record.batch,
                status=record.status,
                trust=count_trust(trusts.get(record.batch), curated_contents(pairs).values()).summary(),
                closed_by=record.close_reason,
                first_seen=record.first_seen,
                last_seen=record.last_seen,
                closed_at=record.closed_at,
                # Every uploaded version has exactly one fate, so these add up to the uploads.
                files=dict(sorted(Counter(f.status.value for f in ledger.files(record.batch)).items())),
                pairs=dict(sorted(Counter(p.status.value for p in pairs).items())),
            )
        )
    # Far ahead: a pair a function recorded a moment ago must not hide behind clock skew.
    pending = ledger.pending_pairs_seen_before(now + timedelta(days=1))
    lock = ledger.lock()
    manifests = _manifest_listing(s3, bucket)
    return DataStatus(
        at=now,
        batch_count=len(records),
        batches=summaries,
        pending_pairs=[
            PendingPair(
                batch=pair.batch,
                stem=pair.stem,
                first_seen=pair.first_seen,
                waiting_for="label" if pair.label is None else "image",
            )
            for pair in sorted(pending, key=lambda p: (p.first_seen, p.batch, p.stem))
        ],
        lock=LockStatus(
            holder=lock.holder,
            acquired_at=lock.acquired_at,
            expires_at=lock.expires_at,
            expired=now >= lock.expires_at,
        )
        if lock
        else None,
        dataset_version_count=len(manifests),
        dataset_versions=manifests[:versions] if versions else manifests,
    )


def _manifest_listing(s3: S3Client, bucket: str) -> list[DatasetVersionSummary]:
    objects: list[dict[str, Any]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefixes.MANIFESTS):
        objects += [dict(item) for item in page.get("Contents", [])]
    keys = {item["Key"] for item in objects}
    found = [
        DatasetVersionSummary(
            version=version,
            key=item["Key"],
            last_modified=item["LastModified"],
            size_bytes=item["Size"],
            purged=prefixes.purged_record_key(item["Key"]) in keys,
        )
        for item in objects
        if (version := prefixes.manifest_version(item["Key"])) is not None
    ]
    # Version names start with their UTC time, so the name breaks ties in LastModified.
    return sorted(found, key=lambda v: (v.last_modified, v.version), reverse=True)
