"""Does the bucket agree with the ledger, and every manifest with the bytes it pins?

`retrain data audit` reads both and changes nothing. It checks that

- every object version under `incoming/`, `dataset/` and `quarantine/` has exactly one fate in
  the ledger: a landing version still there is pending (or the `_COMPLETE` marker); a curated
  version is the destination of one pair side, or an older version of a side uploaded again
  (`superseded`); a quarantined file has a quarantined or duplicate record;
- every ledger record names an object version that is there;
- every line of every manifest names an object version whose bytes hash to the recorded sha256
  (each version is read once, whatever number of manifests pins it);
- no content claim names a file that is in no zone: an erasure that left one behind makes the
  same bytes, uploaded again, a duplicate of a file that is gone.

A held pair (`retrain data held`) is no discrepancy: it is curated (that is its fate), simply in
no dataset version frozen since its content was held. The audit never asks that a curated pair be
in the newest manifest, so it only counts held pairs and the batches they are in.

An object version or a pending record younger than the grace period is listed as too recent to
judge, not as a discrepancy: the intake may be working on it (it copies before it records).
It takes its clients as arguments and knows nothing of a command line, so the CLI and the tests
call the same code.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from functions.common import prefixes
from functions.common.contracts import ManifestEntry
from functions.common.errors import ObjectGoneError, RetrainError
from functions.data.ledger import Ledger
from functions.data.models import FileRecord, FileStatus, PairRecord
from functions.data.reports import count_trust, curated_contents
from retrain.ops.erasure import stem_of
from retrain.ops.status import utc_now

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DEFAULT_GRACE_SECONDS = 300
CHUNK_BYTES = 1024 * 1024


class AuditUsageError(RetrainError, ValueError):
    """An audit asked for something it cannot do (a negative grace period)."""


class Kind(StrEnum):
    """What is wrong, one kind per check; the CLI groups its table by these."""

    UNPROCESSED_UPLOAD = "unprocessed-upload"
    LANDING_COPY_LEFT = "landing-copy-left"
    CURATED_WITHOUT_RECORD = "curated-without-record"
    CURATED_NAMED_TWICE = "curated-named-twice"
    CURATED_PAIR_UNFINISHED = "curated-pair-unfinished"
    QUARANTINED_WITHOUT_RECORD = "quarantined-without-record"
    REASON_WITHOUT_FILE = "reason-without-file"
    RECORD_WITHOUT_OBJECT = "record-without-object"
    MANIFEST_LINE_UNREADABLE = "manifest-line-unreadable"
    MANIFEST_OBJECT_MISSING = "manifest-object-missing"
    MANIFEST_SHA256_MISMATCH = "manifest-sha256-mismatch"
    CLAIM_OF_ERASED_FILE = "claim-of-erased-file"


KIND_TITLES: dict[Kind, str] = {
    Kind.UNPROCESSED_UPLOAD: "Uploads the intake never recorded",
    Kind.LANDING_COPY_LEFT: "Landing copies left behind after their fate was recorded",
    Kind.CURATED_WITHOUT_RECORD: "Curated files no ledger pair names",
    Kind.CURATED_NAMED_TWICE: "Curated files more than one pair names",
    Kind.CURATED_PAIR_UNFINISHED: "Curated files recorded as such, but not on their pair (a judgement cut short)",
    Kind.QUARANTINED_WITHOUT_RECORD: "Quarantined files with no quarantined or duplicate record",
    Kind.REASON_WITHOUT_FILE: "Quarantine reasons beside no file",
    Kind.RECORD_WITHOUT_OBJECT: "Ledger records whose object version is not in the bucket",
    Kind.MANIFEST_LINE_UNREADABLE: "Manifest lines that are no manifest entry",
    Kind.MANIFEST_OBJECT_MISSING: "Manifest lines whose object version is not in the bucket",
    Kind.MANIFEST_SHA256_MISMATCH: "Manifest lines whose object's bytes do not match",
    Kind.CLAIM_OF_ERASED_FILE: "Duplicate-detection claims naming a file that is in no zone",
}


class Discrepancy(BaseModel):
    kind: Kind
    subject: str  # an object key, a ledger item (`pk sk`), or a manifest line (`<key>:<line>`)
    version: str | None = None  # the S3 VersionId concerned, where one is
    detail: str


class TooRecent(BaseModel):
    """An object version or pending record younger than the grace period: not judged yet."""

    subject: str
    version: str | None
    at: datetime
    detail: str


class AuditCounts(BaseModel):
    object_versions: int  # under incoming/, dataset/ (manifests aside) and quarantine/
    file_records: int
    pairs: int
    claims: int
    manifests: int
    manifest_lines: int
    objects_hashed: int
    bytes_hashed: int
    # Records whose superseded quarantine version the bucket's lifecycle rule may have removed
    # (NoncurrentVersionExpiration): not a discrepancy, but counted so nothing is silent.
    expired_by_lifecycle: int = 0
    # Pairs held out of every new dataset version (and the batches they are in): still curated, so
    # not a discrepancy.
    held_batches: int = 0
    held_pairs: int = 0


class AuditReport(BaseModel):
    at: datetime
    bucket: str
    grace_seconds: int
    clean: bool  # no discrepancy (too recent ones do not count)
    checked: AuditCounts
    too_recent: list[TooRecent]
    discrepancies: list[Discrepancy]  # by kind, then subject


class HashProgress(Protocol):
    """Told how much there is to read and hash, then of every chunk read (a progress bar)."""

    def begin(self, objects: int, total_bytes: int) -> None: ...

    def advance(self, read_bytes: int) -> None: ...


def object_sha256(
    s3: S3Client, bucket: str, key: str, version: str | None, on_chunk: Callable[[int], None] | None = None
) -> str:
    """The sha256 of one object version's bytes, read in chunks (a large object is never held whole)."""
    request: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if version and version != "null":
        request["VersionId"] = version
    try:
        body = s3.get_object(**request)["Body"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "NoSuchVersion", "404"}:
            raise ObjectGoneError(f"s3://{bucket}/{key} version {version} is gone") from error
        raise
    digest = hashlib.sha256()
    for chunk in body.iter_chunks(CHUNK_BYTES):
        digest.update(chunk)
        if on_chunk is not None:
            on_chunk(len(chunk))
    return digest.hexdigest()


@dataclass(frozen=True)
class _Listed:
    key: str
    version: str
    latest: bool
    delete_marker: bool
    modified: datetime
    size: int


def _list(s3: S3Client, bucket: str, prefix: str) -> list[_Listed]:
    """Every version and delete marker under `prefix`, with its time and size (the audit needs
    both; `DataBucket.versions` keeps neither)."""
    found: list[_Listed] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for kind, marker in (("Versions", False), ("DeleteMarkers", True)):
            found += [
                _Listed(
                    key=item["Key"],
                    version=item.get("VersionId") or "null",
                    latest=bool(item.get("IsLatest")),
                    delete_marker=marker,
                    modified=item["LastModified"],
                    size=int(item.get("Size", 0)),
                )
                for item in page.get(kind, [])  # type: ignore[attr-defined]
            ]
    return found


def _zone_keys(batch: str, relative: str) -> tuple[str, str, str]:
    """Where a file of a batch (`images/x.jpg`) can be: landing, curated, quarantine."""
    return (
        prefixes.landing_key(batch, relative),
        prefixes.curated_key(batch, relative),
        prefixes.quarantine_key(batch, relative),
    )


def _landing_of(key: str) -> str | None:
    """The landing key a curated or quarantined copy was made from; None if it names none."""
    if key.startswith(prefixes.QUARANTINE):
        batch, sep, relative = key.removeprefix(prefixes.QUARANTINE).partition("/")
        return prefixes.landing_key(batch, relative) if batch and sep and relative else None
    folder, _, rest = key.removeprefix(prefixes.DATASET).partition("/")
    batch, _, name = rest.partition("/")
    if folder not in prefixes.PAIR_FOLDERS or not batch or not name or "/" in name:
        return None
    return prefixes.landing_key(batch, f"{folder}/{name}")


class _Audit:
    def __init__(
        self,
        ledger: Ledger,
        s3: S3Client,
        bucket: str,
        *,
        at: datetime,
        grace: timedelta,
        progress: HashProgress | None,
    ) -> None:
        self.ledger, self.s3, self.bucket = ledger, s3, bucket
        self.at, self.grace, self.progress = at, grace, progress
        self.found: list[Discrepancy] = []
        self.too_recent: list[TooRecent] = []
        self.hashed = (0, 0)
        self.expiry: dict[str, int] = {}  # prefix -> NoncurrentDays of the bucket's lifecycle rules
        self.expired = 0

    def flag(self, kind: Kind, subject: str, detail: str, version: str | None = None) -> None:
        self.found.append(Discrepancy(kind=kind, subject=subject, version=version, detail=detail))

    def fresh(self, moment: datetime) -> bool:
        return self.at - moment < self.grace

    def wait(self, subject: str, version: str | None, moment: datetime, detail: str) -> None:
        self.too_recent.append(TooRecent(subject=subject, version=version, at=moment, detail=detail))

    def may_have_expired(self, key: str, recorded: datetime, keys: set[str]) -> bool:
        """A missing version the lifecycle rule may have removed: the key has a newer version (so this
        one became noncurrent), a rule expires noncurrent versions under the key's prefix, and the
        record is older than that rule's days (a version is noncurrent no earlier than it was made)."""
        if key not in keys:
            return False
        days = [d for prefix, d in self.expiry.items() if key.startswith(prefix)]
        return bool(days) and self.at - recorded > timedelta(days=min(days))

    # ------------------------------------------------------------ objects --
    def landing(self, objects: list[_Listed], records: dict[tuple[str, str], FileRecord]) -> None:
        """A landing version still there is waiting for its partner, is the batch's marker, or was
        refused where it lies (too large to move, or encrypted with a key the intake cannot use)."""
        for obj in objects:
            record = records.get((obj.key, obj.version))
            if record is not None and record.status in {FileStatus.PENDING, FileStatus.MARKER, FileStatus.REFUSED}:
                continue
            if self.fresh(obj.modified):
                self.wait(obj.key, obj.version, obj.modified, "uploaded, not processed yet")
            elif record is None:
                self.flag(
                    Kind.UNPROCESSED_UPLOAD,
                    obj.key,
                    f"uploaded {obj.modified:%Y-%m-%d %H:%M:%S} UTC and never recorded: its event was lost, "
                    "or failed (look at the intake's dead-letter queue)",
                    obj.version,
                )
            else:
                self.flag(
                    Kind.LANDING_COPY_LEFT,
                    obj.key,
                    f"the ledger says {record.status.value}, yet the landing copy is still there",
                    obj.version,
                )

    def zones(self, objects: list[_Listed], pairs: list[PairRecord], files: list[FileRecord]) -> None:
        """Every curated version is one pair side's destination, every quarantined version one
        record's; a version that is neither may be an older copy of a file uploaded again (its
        record then says `superseded` and names no destination), one such version per record."""
        sides = Counter(
            (destination, version or "null")
            for pair in pairs
            for destination, version in (
                (pair.image_destination, pair.image_destination_version),
                (pair.label_destination, pair.label_destination_version),
            )
            if destination
        )
        set_aside = {
            (f.destination, f.destination_version or "null")
            for f in files
            if f.destination and f.status in {FileStatus.QUARANTINED, FileStatus.DUPLICATE}
        }
        curated = {
            (f.destination, f.destination_version or "null"): f
            for f in files
            if f.destination and f.status is FileStatus.CURATED
        }
        superseded = Counter(f.key for f in files if f.status is FileStatus.SUPERSEDED)
        # A refused file's reason stands alone: the file itself was left in incoming/.
        refused = {f.reason_key for f in files if f.status is FileStatus.REFUSED}
        present = {obj.key for obj in objects}
        unexplained: dict[str | None, list[_Listed]] = defaultdict(list)
        for obj in objects:
            if obj.key.startswith(prefixes.QUARANTINE) and obj.key.endswith(prefixes.REASON_SUFFIX):
                quarantined = obj.key.removesuffix(prefixes.REASON_SUFFIX)
                if quarantined not in present and obj.key not in refused and not self.fresh(obj.modified):
                    self.flag(
                        Kind.REASON_WITHOUT_FILE,
                        obj.key,
                        f"{quarantined} is not there (an erasure that stopped half-way?)",
                        obj.version,
                    )
                continue
            named = sides[(obj.key, obj.version)] if obj.key.startswith(prefixes.DATASET) else 0
            record = curated.get((obj.key, obj.version))
            if named > 1:
                self.flag(Kind.CURATED_NAMED_TWICE, obj.key, f"{named} pair sides name this version", obj.version)
            elif named == 0 and record is not None:
                if self.fresh(obj.modified):
                    self.wait(obj.key, obj.version, obj.modified, "curated, its pair not updated yet")
                else:
                    self.flag(
                        Kind.CURATED_PAIR_UNFINISHED,
                        obj.key,
                        f"{record.key} ({record.version}) is recorded curated as this version, but its pair "
                        f"{record.batch}/{stem_of(record.key.rpartition('/')[2])} does not name it: "
                        "the pair will be in no dataset version",
                        obj.version,
                    )
            elif named == 0 and (obj.key, obj.version) not in set_aside:
                unexplained[_landing_of(obj.key)].append(obj)
        for landing, found in unexplained.items():
            # Superseded versions are older than the one that replaced them: the oldest go first.
            found.sort(key=lambda o: (o.modified, o.key, o.version))
            for obj in found[superseded[landing] if landing else 0 :]:
                if self.fresh(obj.modified):
                    self.wait(obj.key, obj.version, obj.modified, "copied, not recorded yet")
                    continue
                in_dataset = obj.key.startswith(prefixes.DATASET)
                self.flag(
                    Kind.CURATED_WITHOUT_RECORD if in_dataset else Kind.QUARANTINED_WITHOUT_RECORD,
                    obj.key,
                    (
                        "no pair side has it as its destination"
                        if in_dataset
                        else "no quarantined or duplicate record has it as its destination"
                    )
                    + (f", and no superseded upload of {landing} accounts for it" if landing else ""),
                    obj.version,
                )

    # ------------------------------------------------------------- ledger --
    def records(self, objects: list[_Listed], pairs: list[PairRecord], files: list[FileRecord]) -> None:
        """Every record names an object version that is there."""
        there = {(obj.key, obj.version) for obj in objects}
        keys = {obj.key for obj in objects}
        for pair in pairs:
            for role, destination, version in (
                ("image", pair.image_destination, pair.image_destination_version),
                ("label", pair.label_destination, pair.label_destination_version),
            ):
                if destination and (destination, version or "null") not in there:
                    self.flag(
                        Kind.RECORD_WITHOUT_OBJECT,
                        f"batch#{pair.batch} pair#{pair.stem}",
                        f"its {role} is curated as {destination}, and that version is not in the bucket",
                        version,
                    )
        for record in files:
            item = f"batch#{record.batch} file#{record.key}#{record.version}"
            if record.status in {FileStatus.CURATED, FileStatus.QUARANTINED, FileStatus.DUPLICATE}:
                self._destination(record, item, there, keys)
            elif record.status is FileStatus.PENDING and (record.key, record.version) not in there:
                if self.fresh(record.recorded_at):
                    self.wait(item, record.version, record.recorded_at, "recorded pending, being judged")
                else:
                    self.flag(
                        Kind.RECORD_WITHOUT_OBJECT,
                        item,
                        "pending, and that version is no longer in the landing zone",
                        record.version,
                    )
            elif record.status is FileStatus.REFUSED:
                # The landing copy is the uploader's to delete (its reason says so); its reason stays.
                if record.reason_key not in keys:
                    self.flag(
                        Kind.RECORD_WITHOUT_OBJECT,
                        item,
                        f"refused, and its reason {record.reason_key} is not in the bucket",
                        record.version,
                    )
            elif record.status is FileStatus.SUPERSEDED:
                relative = prefixes.relative_to_batch(record.key)
                if not keys.intersection(_zone_keys(record.batch, relative)):
                    self.flag(
                        Kind.RECORD_WITHOUT_OBJECT,
                        item,
                        "superseded, and the file is in no zone (erased, and its record left behind?)",
                        record.version,
                    )

    def _destination(self, record: FileRecord, item: str, there: set[tuple[str, str]], keys: set[str]) -> None:
        """A curated, quarantined or duplicate record names the version it was copied to, and it is there."""
        if not record.destination:
            self.flag(Kind.RECORD_WITHOUT_OBJECT, item, f"{record.status.value}, but names no destination")
        elif (record.destination, record.destination_version or "null") not in there:
            if self.may_have_expired(record.destination, record.recorded_at, keys):
                self.expired += 1
                return
            self.flag(
                Kind.RECORD_WITHOUT_OBJECT,
                item,
                f"{record.status.value} as {record.destination}, and that version is not in the bucket",
                record.destination_version,
            )

    def claims(self, objects: list[_Listed], claims: list[tuple[str, str]]) -> None:
        keys = {obj.key for obj in objects}
        for sha256, name in claims:
            batch, _, relative = name.partition("/")
            if keys.intersection(_zone_keys(batch, relative)):
                continue
            self.flag(
                Kind.CLAIM_OF_ERASED_FILE,
                f"content#{sha256} content",
                f"names {name}, which is in no zone: these bytes uploaded again would be a duplicate "
                f"of a file that is gone (`retrain data purge {prefixes.landing_key(batch, relative)}` "
                "removes the claim)",
            )

    # ---------------------------------------------------------- manifests --
    def manifests(self, listed: list[_Listed], objects: list[_Listed]) -> tuple[int, int]:
        """Check every line of every manifest; how many manifests and lines were read."""
        there = {(obj.key, obj.version): obj for obj in objects if obj.key.startswith(prefixes.DATASET)}
        latest = {obj.key: obj for obj in objects if obj.latest}
        expected: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
        read = lines = 0
        for manifest in sorted(listed, key=lambda v: v.key):
            if not manifest.latest or manifest.delete_marker or prefixes.manifest_version(manifest.key) is None:
                continue  # older versions are a purge's business; `.purged.json` is no manifest
            read += 1
            for number, entry in self.entries(manifest):
                lines += 1
                if entry is None:
                    continue
                line = f"{manifest.key}:{number}"
                for role, path, version, sha256 in (
                    ("image", entry.image, entry.image_version_id, entry.image_sha256),
                    ("label", entry.label, entry.label_version_id, entry.label_sha256),
                ):
                    key = f"{prefixes.DATASET}{path}"
                    obj = there.get((key, version)) if version else latest.get(key)
                    if obj is None:
                        self.flag(
                            Kind.MANIFEST_OBJECT_MISSING,
                            line,
                            f"its {role} {key} is not in the bucket" + (" in that version" if version else ""),
                            version,
                        )
                        continue
                    expected[(obj.key, obj.version)].append((line, role, sha256))
        self.check_hashes(expected, there)
        return read, lines

    def entries(self, manifest: _Listed) -> Iterable[tuple[int, ManifestEntry | None]]:
        body = self.s3.get_object(Bucket=self.bucket, Key=manifest.key, VersionId=manifest.version)["Body"]
        for number, raw in enumerate(body.iter_lines(), start=1):
            if not raw.strip():
                continue
            try:
                yield number, ManifestEntry.model_validate_json(raw)
            except ValidationError as error:
                self.flag(
                    Kind.MANIFEST_LINE_UNREADABLE,
                    f"{manifest.key}:{number}",
                    f"not a manifest entry: {error.errors()[0]['msg']}",
                    manifest.version,
                )
                yield number, None

    def check_hashes(
        self, expected: dict[tuple[str, str], list[tuple[str, str, str]]], there: dict[tuple[str, str], _Listed]
    ) -> None:
        total = sum(there[found].size for found in expected)
        if self.progress is not None:
            self.progress.begin(len(expected), total)
        on_chunk = self.progress.advance if self.progress is not None else None
        for (key, version), claims in sorted(expected.items()):
            try:
                actual = object_sha256(self.s3, self.bucket, key, version, on_chunk)
            except ObjectGoneError:
                for line, role, _ in claims:
                    self.flag(Kind.MANIFEST_OBJECT_MISSING, line, f"its {role} {key} went while it was read", version)
                continue
            for line, role, sha256 in claims:
                if actual != sha256:
                    self.flag(
                        Kind.MANIFEST_SHA256_MISMATCH,
                        line,
                        f"its {role} {key} hashes to {actual[:12]}…, the line says {sha256[:12]}…",
                        version,
                    )
        self.hashed = (len(expected), total)


def noncurrent_expiry(s3: S3Client, bucket: str) -> dict[str, int]:
    """Prefix -> days after which the bucket's enabled lifecycle rules remove noncurrent versions."""
    try:
        rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "NoSuchLifecycleConfiguration":
            return {}
        raise
    expiry: dict[str, int] = {}
    for rule in rules:
        days = rule.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays")
        if rule.get("Status") != "Enabled" or days is None:
            continue
        prefix = rule.get("Filter", {}).get("Prefix", rule.get("Prefix", ""))
        expiry[prefix] = min(days, expiry.get(prefix, days))
    return expiry


def audit(
    ledger: Ledger,
    s3: S3Client,
    bucket: str,
    *,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    clock: Callable[[], datetime] = utc_now,
    progress: HashProgress | None = None,
) -> AuditReport:
    """Reconcile every object version with the ledger and every manifest line with its bytes."""
    if grace_seconds < 0:
        raise AuditUsageError(f"the grace period cannot be negative ({grace_seconds} s)")
    at = clock()
    run = _Audit(ledger, s3, bucket, at=at, grace=timedelta(seconds=grace_seconds), progress=progress)
    run.expiry = noncurrent_expiry(s3, bucket)
    # The ledger first: an object copied after this look is younger than what the ledger said.
    batches = ledger.batches()
    files = [record for batch in batches for record in ledger.files(batch.batch)]
    pairs = [pair for batch in batches for pair in ledger.pairs(batch.batch)]
    claims = ledger.claims()
    by_batch: defaultdict[str, list[PairRecord]] = defaultdict(list)
    for pair in pairs:
        by_batch[pair.batch].append(pair)
    # Held pairs by batch: verdicts on the pairs' current contents (a replaced label's is history).
    held = {
        batch: count
        for batch, trust in ledger.trusts().items()
        if (count := count_trust(trust, curated_contents(by_batch[batch]).values()).held)
    }
    listed = [v for zone in (prefixes.INCOMING, prefixes.DATASET, prefixes.QUARANTINE) for v in _list(s3, bucket, zone)]
    manifests = [v for v in listed if v.key.startswith(prefixes.MANIFESTS)]
    # A delete marker holds no bytes: a key deleted without its VersionId is not an object.
    objects = [v for v in listed if not v.delete_marker and not v.key.startswith(prefixes.MANIFESTS)]
    records = {(f.key, f.version): f for f in files}
    run.landing([o for o in objects if o.key.startswith(prefixes.INCOMING)], records)
    run.zones([o for o in objects if not o.key.startswith(prefixes.INCOMING)], pairs, files)
    run.records(objects, pairs, files)
    run.claims(objects, claims)
    manifest_count, line_count = run.manifests(manifests, objects)
    order = list(Kind)
    return AuditReport(
        at=at,
        bucket=bucket,
        grace_seconds=grace_seconds,
        clean=not run.found,
        checked=AuditCounts(
            object_versions=len(objects),
            file_records=len(files),
            pairs=len(pairs),
            claims=len(claims),
            manifests=manifest_count,
            manifest_lines=line_count,
            objects_hashed=run.hashed[0],
            bytes_hashed=run.hashed[1],
            expired_by_lifecycle=run.expired,
            held_batches=len(held),
            held_pairs=sum(held.values()),
        ),
        too_recent=sorted(run.too_recent, key=lambda t: (t.subject, t.version or "")),
        discrepancies=sorted(run.found, key=lambda d: (order.index(d.kind), d.subject, d.version or "")),
    )
