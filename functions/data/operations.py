"""Operating the data: what the ledger and the bucket hold, and erasure on request.

`data_status` is the overview an engineer asks for (batches and their outcomes, pairs waiting
for a partner, the retraining lock, the newest dataset versions). `purge` erases images and
their labels everywhere they are, for erasure requests (the images show faces and number
plates): every S3 version and delete marker of the landing, curated and quarantine copies, the
ledger's items, and their lines in every dataset manifest. Both take their clients as arguments
and know nothing of a command line, so the CLI and a future Lambda share them.

Order of a purge, chosen so that an interrupted one is finished by running it again: the ledger
first (the trigger stops putting the pair into new dataset versions), then the objects, then the
manifests, then a second look at the bucket (something written meanwhile is erased too), then
the batch reports.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from functions.common import prefixes
from functions.common.contracts import ManifestEntry
from functions.common.errors import RetrainError
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, FileRecord, PairRecord
from functions.data.reports import write_report
from functions.data.storage import DataBucket
from functions.intake.logic import UNBATCHED
from functions.validation import Role
from functions.validation.names import IMAGES_DIR, LABELS_DIR, split_name

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MANIFEST_SUFFIX = ".jsonl"
PURGED_SUFFIX = ".purged.json"
REASON_SUFFIX = ".reason.json"
DELETE_CHUNK = 1000  # DeleteObjects takes at most 1,000 keys
FOLDERS = (IMAGES_DIR, LABELS_DIR)


def utc_now() -> datetime:
    return datetime.now(UTC)


# ----------------------------------------------------------------- status --
class BatchSummary(BaseModel):
    batch: str
    status: BatchStatus
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
    summaries = [
        BatchSummary(
            batch=record.batch,
            status=record.status,
            closed_by=record.close_reason,
            first_seen=record.first_seen,
            last_seen=record.last_seen,
            closed_at=record.closed_at,
            # Every uploaded version has exactly one fate, so these add up to the uploads.
            files=dict(sorted(Counter(f.status.value for f in ledger.files(record.batch)).items())),
            pairs=dict(sorted(Counter(p.status.value for p in ledger.pairs(record.batch)).items())),
        )
        for record in shown
    ]
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
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefixes.MANIFESTS
    ):
        objects += [dict(item) for item in page.get("Contents", [])]
    keys = {item["Key"] for item in objects}
    found = [
        DatasetVersionSummary(
            version=item["Key"].removeprefix(prefixes.MANIFESTS).removesuffix(MANIFEST_SUFFIX),
            key=item["Key"],
            last_modified=item["LastModified"],
            size_bytes=item["Size"],
            purged=_purged_record(item["Key"]) in keys,
        )
        for item in objects
        if item["Key"].endswith(MANIFEST_SUFFIX) and "/" not in _after(item["Key"])
    ]
    # Version names start with their UTC time, so the name breaks ties in LastModified.
    return sorted(found, key=lambda v: (v.last_modified, v.version), reverse=True)


def _after(manifest_key: str) -> str:
    return manifest_key.removeprefix(prefixes.MANIFESTS)


def _purged_record(manifest_key: str) -> str:
    return manifest_key.removesuffix(MANIFEST_SUFFIX) + PURGED_SUFFIX


# ------------------------------------------------------------------ purge --
class PurgeUsageError(ValueError):
    """A KEY that names no image, label or pair of the data bucket."""


class PurgeError(RetrainError):
    """S3 refused part of an erasure; running the same purge again finishes it."""


@dataclass(frozen=True)
class Target:
    """What one KEY names: a pair (`stem`) of a batch, or a lone landing file (`key`)."""

    given: str
    batch: str
    stem: str | None
    key: str | None = None


def stem_of(name: str) -> str:
    """The pair a file name belongs to, as intake names it (`x.jpg`, `x.png.reason.json`: x)."""
    return unicodedata.normalize("NFC", split_name(name.removesuffix(REASON_SUFFIX))[0])


def parse_target(given: str, bucket: str) -> Target:
    """`incoming/<batch>/images/x.jpg`, `dataset/labels/<batch>/x.png`, `quarantine/...`,
    `<batch>/<stem>`, or any of those as `s3://<bucket>/...`."""
    raw = given.strip()
    if raw.startswith("s3://"):
        name, _, raw = raw.removeprefix("s3://").partition("/")
        if name != bucket:
            raise PurgeUsageError(f"{given}: not in the data bucket {bucket}")
    if raw.startswith(prefixes.INCOMING):
        batch = prefixes.batch_of(raw) or UNBATCHED
        return _landing_target(given, batch, prefixes.relative_to_batch(raw), raw)
    if raw.startswith(prefixes.QUARANTINE):
        batch, sep, relative = raw.removeprefix(prefixes.QUARANTINE).partition("/")
        relative = relative.removesuffix(REASON_SUFFIX)
        if not (batch and sep and relative):
            raise PurgeUsageError(f"{given}: expected quarantine/<batch>/<file>")
        landing = f"{prefixes.INCOMING}{relative if batch == UNBATCHED else f'{batch}/{relative}'}"
        return _landing_target(given, batch, relative, landing)
    if raw.startswith(prefixes.DATASET):
        folder, _, rest = raw.removeprefix(prefixes.DATASET).partition("/")
        batch, _, name = rest.partition("/")
        if folder not in FOLDERS or not batch or not name or "/" in name:
            raise PurgeUsageError(
                f"{given}: expected dataset/images/<batch>/<file> or dataset/labels/<batch>/<file>"
                " (a manifest is not erased; the pairs in it are)"
            )
        return Target(given, batch, stem_of(name))
    parts = raw.split("/")
    if len(parts) == 2 and all(parts) and not raw.startswith(prefixes.REPORTS):
        return Target(given, parts[0], unicodedata.normalize("NFC", parts[1]))
    raise PurgeUsageError(
        f"{given}: expected incoming/<batch>/images|labels/<file>, "
        "dataset/images|labels/<batch>/<file>, quarantine/<batch>/... or <batch>/<stem>"
    )


def _landing_target(given: str, batch: str, relative: str, key: str) -> Target:
    folder, _, name = relative.partition("/")
    if folder in FOLDERS and name and "/" not in name:
        return Target(given, batch, stem_of(name), key)
    return Target(given, batch, None, key)  # a stray file: no pair to look for


class ObjectVersion(BaseModel):
    key: str
    version_id: str
    delete_marker: bool = False
    latest: bool = False


class ErasedPair(BaseModel):
    batch: str
    stem: str | None  # None: a lone landing file that was no pair's
    key: str | None
    requested_as: str
    why: str  # "requested", or "same image bytes as <batch>/<stem>"
    status: str | None  # the pair's status in the ledger, if it had a record


class ManifestChange(BaseModel):
    manifest: str
    dataset_version: str
    entries_removed: list[str]  # the image paths of the lines taken out
    record: str  # dataset/manifests/<version>.purged.json
    versions_deleted: int  # older versions of the manifest (they still held the lines)


class PurgeReport(BaseModel):
    dry_run: bool
    at: datetime
    requested: list[str]
    unmatched: list[str]  # KEYs that matched nothing (exit 1)
    pairs: list[ErasedPair]
    objects: list[ObjectVersion]
    ledger_items: list[str]
    manifests: list[ManifestChange]
    reports: list[str]  # batch reports rewritten without the erased files
    remaining: list[ObjectVersion]  # found again after erasing and still there: should be empty
    warnings: list[str]


@dataclass
class _Subject:
    """One pair (or lone file) to erase, and where it was found."""

    batch: str
    stem: str | None
    key: str | None
    requested_as: str
    why: str
    pair: PairRecord | None = None
    files: list[FileRecord] = field(default_factory=list)
    objects: list[ObjectVersion] = field(default_factory=list)
    named_keys: set[str] = field(default_factory=set)  # where the ledger says copies went

    @property
    def ident(self) -> tuple[str, str]:
        return _ident(self.batch, self.stem, self.key)

    @property
    def found(self) -> bool:
        return bool(self.pair or self.files or self.objects)

    def image_hashes(self) -> set[str]:
        hashes = {f.sha256 for f in self.files if f.role is Role.IMAGE and f.sha256}
        if self.pair is not None and self.pair.image is not None and self.pair.image.check.sha256:
            hashes.add(self.pair.image.check.sha256)
        return hashes

    def claims(self) -> list[tuple[str, str]]:
        """The content-index claims this subject's images may hold: (sha256, `<batch>/<key>`)."""
        claims = {
            (f.sha256, f"{f.batch}/{prefixes.relative_to_batch(f.key)}")
            for f in self.files
            if f.role is Role.IMAGE and f.sha256
        }
        if self.pair is not None and self.pair.image is not None and self.pair.image.check.sha256:
            claims.add(
                (self.pair.image.check.sha256, f"{self.pair.batch}/{self.pair.image.check.key}")
            )
        return sorted(claims)


@dataclass
class _ManifestPlan:
    key: str
    version_id: str
    kept: list[str]
    removed: list[ManifestEntry]
    stale_versions: list[ObjectVersion]


class Purger:
    """Finds every copy of what KEYs name, then erases it (or, dry, says what it would erase)."""

    def __init__(
        self, ledger: Ledger, s3: S3Client, bucket: str, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self._ledger = ledger
        self._s3 = s3
        self._bucket = bucket
        self._clock = clock
        self._listings: dict[str, list[ObjectVersion]] = {}
        self._files: dict[str, list[FileRecord]] = {}
        self._pairs: dict[str, list[PairRecord]] = {}

    # ------------------------------------------------------------ finding --
    def find(self, targets: list[Target]) -> dict[tuple[str, str], _Subject]:
        subjects: dict[tuple[str, str], _Subject] = {}
        for target in targets:
            subject = _Subject(target.batch, target.stem, target.key, target.given, "requested")
            subjects.setdefault(subject.ident, subject)
        for subject in subjects.values():
            self._locate(subject)
        # A photograph uploaded twice is the same photograph: erase every copy of its bytes.
        for copy in self._same_images([s for s in subjects.values() if s.found]):
            subjects.setdefault(copy.ident, copy)
        return subjects

    def _locate(self, subject: _Subject) -> None:
        batch = subject.batch
        if subject.stem is not None:
            found = self._ledger.pair(batch, subject.stem)
            subject.pair = found[0] if found else None
            subject.files = [f for f in self._batch_files(batch) if self._is_part(subject, f.key)]
        else:
            subject.files = [f for f in self._batch_files(batch) if f.key == subject.key]
        named = {f.key for f in subject.files} | {
            f.destination for f in subject.files if f.destination
        }
        if subject.key:
            # Where intake sets a stray file aside, whether or not the ledger still says so.
            quarantined = prefixes.quarantine_key(batch, prefixes.relative_to_batch(subject.key))
            named |= {subject.key, quarantined}
        if subject.pair is not None:
            pair = subject.pair
            named |= {side.key for side in (pair.image, pair.label) if side is not None}
            named |= {d for d in (pair.image_destination, pair.label_destination) if d}
        named |= {prefixes.reason_key(k) for k in named if k.startswith(prefixes.QUARANTINE)}
        subject.named_keys = named
        subject.objects = self.objects_of(subject)

    def objects_of(self, subject: _Subject) -> list[ObjectVersion]:
        """Every version and delete marker of the subject's files, in every zone."""
        found: dict[tuple[str, str], ObjectVersion] = {}
        if subject.stem is not None:
            for folder in _pair_folders(subject.batch):
                for version in self._listing(folder):
                    if self._is_part(subject, version.key):
                        found[(version.key, version.version_id)] = version
        for key in subject.named_keys:
            for version in self._listing(key):
                if version.key == key:
                    found[(version.key, version.version_id)] = version
        return sorted(found.values(), key=lambda v: (v.key, v.version_id))

    def _is_part(self, subject: _Subject, key: str) -> bool:
        """Whether `key` is one of the pair's files in any zone (or its `.reason.json`)."""
        for folder in _pair_folders(subject.batch):
            if key.startswith(folder):
                name = key.removeprefix(folder)
                return "/" not in name and stem_of(name) == subject.stem
        return False

    def _same_images(self, subjects: list[_Subject]) -> list[_Subject]:
        hashes = {h: s for s in subjects for h in s.image_hashes()}
        if not hashes:
            return []
        taken = {s.ident for s in subjects}
        copies = []
        for batch in self._ledger.batches():
            for pair in self._batch_pairs(batch.batch):
                sha = pair.image.check.sha256 if pair.image is not None else None
                origin = hashes.get(sha) if sha else None
                if origin is None or (pair.batch, pair.stem) in taken:
                    continue
                copy = _Subject(
                    pair.batch,
                    pair.stem,
                    None,
                    origin.requested_as,
                    f"same image bytes as {origin.batch}/{origin.stem or origin.key}",
                )
                self._locate(copy)
                copies.append(copy)
                taken.add(copy.ident)
        return copies

    def _batch_files(self, batch: str) -> list[FileRecord]:
        if batch not in self._files:
            self._files[batch] = self._ledger.files(batch)
        return self._files[batch]

    def _batch_pairs(self, batch: str) -> list[PairRecord]:
        if batch not in self._pairs:
            self._pairs[batch] = self._ledger.pairs(batch)
        return self._pairs[batch]

    def _listing(self, prefix: str) -> list[ObjectVersion]:
        """Every version and delete marker under `prefix` (cached until `forget`)."""
        if prefix not in self._listings:
            versions: list[ObjectVersion] = []
            pages = self._s3.get_paginator("list_object_versions").paginate(
                Bucket=self._bucket, Prefix=prefix
            )
            for page in pages:
                for kind, marker in (("Versions", False), ("DeleteMarkers", True)):
                    versions += [
                        ObjectVersion(
                            key=item["Key"],
                            version_id=item.get("VersionId") or "null",
                            delete_marker=marker,
                            latest=bool(item.get("IsLatest")),
                        )
                        for item in page.get(kind, [])  # type: ignore[attr-defined]
                    ]
            self._listings[prefix] = versions
        return self._listings[prefix]

    def forget(self) -> None:
        self._listings.clear()

    # ---------------------------------------------------------- manifests --
    def manifest_plans(self, subjects: list[_Subject]) -> list[_ManifestPlan]:
        pairs = {(s.batch, s.stem) for s in subjects if s.stem is not None}
        paths = {
            key.removeprefix(prefixes.DATASET)
            for s in subjects
            for key in s.named_keys | {o.key for o in s.objects}
            if key.startswith(prefixes.DATASET)
        }

        def erased(entry: ManifestEntry) -> bool:
            name = entry.image.rpartition("/")[2]
            return (
                (entry.batch, stem_of(name)) in pairs
                or entry.image in paths
                or entry.label in paths
            )

        every = self._listing(prefixes.MANIFESTS)
        plans = []
        for current in every:
            key = current.key
            if not (current.latest and not current.delete_marker and key.endswith(MANIFEST_SUFFIX)):
                continue
            kept, removed = self._split_manifest(current, erased)
            stale = [v for v in every if v.key == key and v.version_id != current.version_id]
            # Older versions are left only by a purge cut short: its `.purged.json` says so.
            unfinished = bool(stale) and any(v.key == _purged_record(key) for v in every)
            if removed or unfinished:
                plans.append(_ManifestPlan(key, current.version_id, kept, removed, stale))
        return plans

    def _split_manifest(
        self, current: ObjectVersion, erased: Callable[[ManifestEntry], bool]
    ) -> tuple[list[str], list[ManifestEntry]]:
        body = self._s3.get_object(
            Bucket=self._bucket, Key=current.key, VersionId=current.version_id
        )["Body"]
        kept: list[str] = []
        removed: list[ManifestEntry] = []
        for raw in body.iter_lines():
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            try:
                entry = ManifestEntry.model_validate_json(line)
            except ValidationError:
                kept.append(line)  # not ours to judge; the trainer will say what is wrong
                continue
            if erased(entry):
                removed.append(entry)
            else:
                kept.append(line)
        return kept, removed

    def rewrite_manifest(self, plan: _ManifestPlan, at: datetime) -> ManifestChange:
        """Record what left the manifest, write it without those lines, and delete every older
        version: an erased pair must not survive in a version someone can still read."""
        version = _after(plan.key).removesuffix(MANIFEST_SUFFIX)
        record_key = _purged_record(plan.key)
        if plan.removed:
            record = self._read_json(record_key) or {
                "dataset_version": version,
                "manifest": plan.key,
                "erasures": [],
            }
            record["erasures"].append(
                {
                    "erased_at": at.isoformat(),
                    "reason": "erasure request",
                    "entries": [entry.model_dump(mode="json") for entry in plan.removed],
                }
            )
            DataBucket(self._s3, self._bucket).put_json(record_key, record)
            written = self._s3.put_object(
                Bucket=self._bucket,
                Key=plan.key,
                Body="".join(f"{line}\n" for line in plan.kept).encode(),
                ContentType="application/x-ndjson",
            ).get("VersionId")
        else:
            written = plan.version_id  # only the leftovers of an interrupted purge to clear
        self.forget()
        stale = [
            v for v in self._listing(plan.key) if v.key == plan.key and v.version_id != written
        ]
        if written is not None:
            self.delete(stale)
        return ManifestChange(
            manifest=plan.key,
            dataset_version=version,
            entries_removed=[entry.image for entry in plan.removed],
            record=record_key,
            versions_deleted=len(stale) if written is not None else 0,
        )

    def _read_json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise
        document: dict[str, Any] = json.loads(body)
        return document

    # ------------------------------------------------------------ erasing --
    def delete(self, versions: Iterable[ObjectVersion]) -> None:
        pending = [{"Key": v.key, "VersionId": v.version_id} for v in versions]
        for start in range(0, len(pending), DELETE_CHUNK):
            response = self._s3.delete_objects(
                Bucket=self._bucket,
                Delete={"Objects": pending[start : start + DELETE_CHUNK], "Quiet": True},  # type: ignore[typeddict-item]
            )
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise PurgeError(
                    f"S3 refused to delete {len(errors)} object versions, such as "
                    f"{first.get('Key')} ({first.get('VersionId')}): {first.get('Code')} "
                    f"{first.get('Message')}; run the same purge again to finish"
                )

    def report_folder(self, batch: str) -> str | None:
        """Where the batch's report is, if it has one (only closed batches do)."""
        found = self._ledger.batch(batch)
        if found is None or found[0].status is not BatchStatus.CLOSED:
            return None
        return prefixes.report_key(batch, "")

    def rewrite_report(self, batch: str) -> str | None:
        """The batch's report from the ledger as it is now; older versions named the files."""
        if self.report_folder(batch) is None:
            return None
        write_report(batch, self._ledger, DataBucket(self._s3, self._bucket))
        folder = prefixes.report_key(batch, "")
        self.forget()
        self.delete(v for v in self._listing(folder) if not v.latest)
        return folder


def _pair_folders(batch: str) -> list[str]:
    """Where a pair's files can be: landing, curated and quarantine zones."""
    return [
        zone
        for folder in FOLDERS
        for zone in (
            f"{prefixes.INCOMING}{batch}/{folder}/",
            f"{prefixes.DATASET}{folder}/{batch}/",
            f"{prefixes.QUARANTINE}{batch}/{folder}/",
        )
    ]


def purge(
    ledger: Ledger,
    s3: S3Client,
    bucket: str,
    keys: list[str],
    *,
    dry_run: bool = False,
    clock: Callable[[], datetime] = utc_now,
) -> PurgeReport:
    """Erase what `keys` name (see `parse_target`) everywhere; with `dry_run`, only say what.

    Raises `PurgeUsageError` before touching anything when a KEY names nothing erasable.
    """
    if not keys:
        raise PurgeUsageError("name at least one KEY to erase")
    targets = [parse_target(key, bucket) for key in keys]
    at = clock()
    purger = Purger(ledger, s3, bucket, clock)
    subjects = purger.find(targets)
    unmatched = [t.given for t in targets if not subjects[_ident(t.batch, t.stem, t.key)].found]
    erasing = [s for s in subjects.values() if s.found]
    plans = purger.manifest_plans(erasing)
    objects = _unique(o for s in erasing for o in s.objects)
    warnings = _warnings(ledger, plans, at)
    ledger_items: list[str] = []
    for subject in erasing:
        ledger_items += ledger.erase(
            subject.batch,
            stem=subject.stem,
            files=subject.files,
            claims=subject.claims(),
            dry_run=dry_run,
        )
    batches = sorted({s.batch for s in erasing})
    report = PurgeReport(
        dry_run=dry_run,
        at=at,
        requested=list(keys),
        unmatched=unmatched,
        pairs=[
            ErasedPair(
                batch=s.batch,
                stem=s.stem,
                key=s.key,
                requested_as=s.requested_as,
                why=s.why,
                status=s.pair.status.value if s.pair else None,
            )
            for s in erasing
        ],
        objects=objects,
        ledger_items=ledger_items,
        manifests=[_planned_change(plan) for plan in plans],
        reports=[folder for b in batches if (folder := purger.report_folder(b))],
        remaining=[],
        warnings=warnings,
    )
    if dry_run:
        return report
    purger.delete(objects)
    changes = [purger.rewrite_manifest(plan, at) for plan in plans]
    # A second look: an intake that was mid-way may have written a copy meanwhile.
    purger.forget()
    late = _unique(o for s in erasing for o in purger.objects_of(s))
    purger.delete(late)
    purger.forget()
    remaining = _unique(o for s in erasing for o in purger.objects_of(s))
    return report.model_copy(
        update={
            "objects": _unique([*objects, *late]),
            "manifests": changes,
            "reports": [folder for b in batches if (folder := purger.rewrite_report(b))],
            "remaining": remaining,
        }
    )


def _planned_change(plan: _ManifestPlan) -> ManifestChange:
    return ManifestChange(
        manifest=plan.key,
        dataset_version=_after(plan.key).removesuffix(MANIFEST_SUFFIX),
        entries_removed=[entry.image for entry in plan.removed],
        record=_purged_record(plan.key),
        # The version read goes too, once the manifest is written without the lines.
        versions_deleted=len(plan.stale_versions) + (1 if plan.removed else 0),
    )


def _ident(batch: str, stem: str | None, key: str | None) -> tuple[str, str]:
    return (batch, stem if stem is not None else f"key:{key}")


def _unique(versions: Iterable[ObjectVersion]) -> list[ObjectVersion]:
    found = {(v.key, v.version_id): v for v in versions}
    return [found[k] for k in sorted(found)]


def _warnings(ledger: Ledger, plans: list[_ManifestPlan], at: datetime) -> list[str]:
    lock = ledger.lock()
    touched = {_after(plan.key).removesuffix(MANIFEST_SUFFIX) for plan in plans if plan.removed}
    if lock is None or at >= lock.expires_at or lock.holder not in touched:
        return []
    return [
        f"run {lock.holder} holds the lock and trains on a dataset version that held these "
        "files: its FSx copy and training instances keep them until it ends (stop it to "
        "erase them now)"
    ]
