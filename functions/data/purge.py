"""Erasure on request: images and their labels erased everywhere they are.

For erasure requests (the images show faces and number plates): every S3 version and delete
marker of the landing, curated and quarantine copies, the ledger's items, and their lines in every
dataset manifest. It takes its clients as arguments and knows nothing of a command line, so the
CLI and a future Lambda share it.

Order of a purge, chosen so that an interrupted one is finished by running it again: the ledger
first (the trigger stops putting the pair into new dataset versions), then the objects, then the
manifests, then a second look at the bucket (something written meanwhile is erased too), then
the batch reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from functions.common import prefixes
from functions.common.contracts import ManifestEntry
from functions.common.errors import RetrainError
from functions.data.erasure import (
    ErasedPair,
    ManifestChange,
    PurgeReport,
    PurgeUsageError,
    Target,
    parse_target,
    stem_of,
)
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, FileRecord, ObjectVersion, PairRecord
from functions.data.reports import write_report
from functions.data.status import utc_now
from functions.data.storage import DataBucket, DeleteRefusedError
from functions.validation import Role

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class PurgeError(RetrainError):
    """S3 refused part of an erasure; running the same purge again finishes it."""


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
            claims.add((self.pair.image.check.sha256, f"{self.pair.batch}/{self.pair.image.check.key}"))
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

    def __init__(self, ledger: Ledger, s3: S3Client, bucket: str, clock: Callable[[], datetime] = utc_now) -> None:
        self._ledger = ledger
        self._data = DataBucket(s3, bucket)
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
        named = {f.key for f in subject.files} | {f.destination for f in subject.files if f.destination}
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
            for folder in prefixes.pair_folders(subject.batch):
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
        for folder in prefixes.pair_folders(subject.batch):
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
            self._listings[prefix] = self._data.versions(prefix)
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
            return (entry.batch, stem_of(name)) in pairs or entry.image in paths or entry.label in paths

        every = self._listing(prefixes.MANIFESTS)
        plans = []
        for current in every:
            key = current.key
            current_manifest = key.endswith(prefixes.MANIFEST_SUFFIX) and current.latest
            if not current_manifest or current.delete_marker:
                continue
            kept, removed = self._split_manifest(current, erased)
            stale = [v for v in every if v.key == key and v.version_id != current.version_id]
            # Older versions are left only by a purge cut short: its `.purged.json` says so.
            record = prefixes.purged_record_key(key)
            unfinished = bool(stale) and any(v.key == record for v in every)
            if removed or unfinished:
                plans.append(_ManifestPlan(key, current.version_id, kept, removed, stale))
        return plans

    def _split_manifest(
        self, current: ObjectVersion, erased: Callable[[ManifestEntry], bool]
    ) -> tuple[list[str], list[ManifestEntry]]:
        kept: list[str] = []
        removed: list[ManifestEntry] = []
        for line in self._data.lines(current.key, current.version_id):
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
        version = _version_of(plan.key)
        record_key = prefixes.purged_record_key(plan.key)
        if plan.removed:
            record = self._data.get_json(record_key) or {
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
            self._data.put_json(record_key, record)
            written = self._data.put_text(plan.key, "".join(f"{line}\n" for line in plan.kept), "application/x-ndjson")
        else:
            written = plan.version_id  # only the leftovers of an interrupted purge to clear
        self.forget()
        stale = [v for v in self._listing(plan.key) if v.key == plan.key and v.version_id != written]
        if written is not None:
            self.delete(stale)
        return ManifestChange(
            manifest=plan.key,
            dataset_version=version,
            entries_removed=[entry.image for entry in plan.removed],
            record=record_key,
            versions_deleted=len(stale) if written is not None else 0,
        )

    # ------------------------------------------------------------ erasing --
    def delete(self, versions: Iterable[ObjectVersion]) -> None:
        try:
            self._data.delete_versions(versions)
        except DeleteRefusedError as error:
            raise PurgeError(f"{error}; run the same purge again to finish") from error

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
        write_report(batch, self._ledger, self._data)
        folder = prefixes.report_key(batch, "")
        self.forget()
        self.delete(v for v in self._listing(folder) if not v.latest)
        return folder


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
        dataset_version=_version_of(plan.key),
        entries_removed=[entry.image for entry in plan.removed],
        record=prefixes.purged_record_key(plan.key),
        # The version read goes too, once the manifest is written without the lines.
        versions_deleted=len(plan.stale_versions) + (1 if plan.removed else 0),
    )


def _version_of(manifest: str) -> str:
    # Any `.jsonl` under the manifests prefix is erased from, even one nobody should have nested.
    return manifest.removeprefix(prefixes.MANIFESTS).removesuffix(prefixes.MANIFEST_SUFFIX)


def _ident(batch: str, stem: str | None, key: str | None) -> tuple[str, str]:
    return (batch, stem if stem is not None else f"key:{key}")


def _unique(versions: Iterable[ObjectVersion]) -> list[ObjectVersion]:
    found = {(v.key, v.version_id): v for v in versions}
    return [found[k] for k in sorted(found)]


def _warnings(ledger: Ledger, plans: list[_ManifestPlan], at: datetime) -> list[str]:
    lock = ledger.lock()
    touched = {_version_of(plan.key) for plan in plans if plan.removed}
    if lock is None or at >= lock.expires_at or lock.holder not in touched:
        return []
    return [
        f"run {lock.holder} holds the lock and trains on a dataset version that held these "
        "files: its FSx copy and training instances keep them until it ends (stop it to "
        "erase them now)"
    ]
