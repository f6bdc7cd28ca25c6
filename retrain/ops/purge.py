"""Erasure on request: images and their labels erased everywhere they are.

For erasure requests (the images show faces and number plates): every S3 version and delete
marker of the landing, curated and quarantine copies, the ledger's items, and their lines in every
dataset manifest. It takes its clients as arguments and knows nothing of a command line, so the
CLI and the tests call the same code.

Order of a purge, chosen so that an interrupted one is finished by running it again: the ledger
first (the trigger stops putting the pair into new dataset versions), then the objects, then the
manifests, then a second look at the bucket (something written meanwhile is erased too), then
the trust item of a batch erased whole (`trust#<batch>`: its held pairs must stay out of new
versions until nothing of it is left), then the batch reports. A pair on its team's relabel list
has a picture beside the batch report (`fix/<n>.png`) that shows the image: it leaves the list
with the ledger's items, and the pictures the list no longer names are erased with the objects.

A purge holds the trigger's lock while it works (`PurgeLease`), so that no dataset version is
frozen meanwhile: a trigger that read the pairs before the ledger's items went could otherwise
write a manifest after the purge rewrote the manifests, still listing the erased pair. While a
run holds the lock the purge changes nothing and says so (`LockHeldError`), or waits for it. A dry
run takes no lock.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from functions.common import prefixes
from functions.common.contracts import ManifestEntry
from functions.common.errors import ObjectGoneError, RetrainError
from functions.data.ledger import Ledger
from functions.data.ledger_batches import PURGE_HOLDER_PREFIX
from functions.data.ledger_trust import TRUST_SK, trust_pk
from functions.data.models import (
    BatchStatus,
    BatchTrust,
    FileRecord,
    LockRecord,
    ObjectVersion,
    PairRecord,
    PairToFix,
)
from functions.data.reports import REPORT_JSON, REPORT_MARKDOWN, write_report
from functions.data.run_lock import Executions, RunLock
from functions.data.storage import DataBucket, DeleteRefusedError
from functions.validation import Role
from retrain.ops.audit import object_sha256
from retrain.ops.erasure import (
    ErasedPair,
    ManifestChange,
    PurgeReport,
    PurgeUsageError,
    Target,
    parse_target,
    stem_of,
)
from retrain.ops.status import utc_now

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Short: a purge that dies keeps the trigger from freezing a dataset version for at most this
# long. The lease is renewed before every step, so a long purge keeps it.
PURGE_LEASE_SECONDS = 300
WAIT_POLL_SECONDS = 15.0
# Where the evaluation copies the relabel list's pictures, beside the batch report
# (functions/evaluate_run/trust.py writes `fix/<n>.png`).
FIX_PICTURES = "fix/"


def trust_item(batch: str) -> str:
    """The ledger item of a batch's trust, as a purge names what it erased (`pk sk`)."""
    return f"{trust_pk(batch)} {TRUST_SK}"


class PurgeError(RetrainError):
    """S3 refused part of an erasure; running the same purge again finishes it."""


class LockHeldError(RetrainError):
    """A run (or another purge) holds the trigger's lock: the purge changed nothing."""

    def __init__(self, lock: LockRecord) -> None:
        if Ledger.is_purge_holder(lock.holder):
            message = (
                f"another purge ({lock.holder}) holds the retraining lock until {lock.expires_at:%Y-%m-%d %H:%M:%S} "
                "UTC: nothing was changed; retry after it, or pass --wait"
            )
        else:
            message = (
                f"run {lock.holder} holds the retraining lock (since {lock.acquired_at:%Y-%m-%d %H:%M:%S} UTC), "
                "and a purge must not erase while a dataset version may be frozen: nothing was changed; "
                "retry after the run ends, or pass --wait to erase as soon as it does"
            )
        super().__init__(message)
        self.lock = lock


@dataclass
class PurgeLease:
    """The trigger's lock, held by a purge (`purge:<UTC time>-<random>`).

    Released by ending the lease, not by deleting the item: a trigger that read the lock free
    before the purge took it may be about to take it (`attribute_not_exists`), with pairs read
    before the erasure; an item still there makes that write fail. Every renewal writes a new
    holder name, for the same reason: a trigger that saw the lease lapse cannot take over the
    renewed one by the old name."""

    ledger: Ledger
    record: LockRecord
    clock: Callable[[], datetime]
    seconds: float = PURGE_LEASE_SECONDS

    @classmethod
    def take(
        cls,
        ledger: Ledger,
        *,
        clock: Callable[[], datetime],
        runs: Executions | None = None,
        wait: bool = False,
        on_wait: Callable[[LockRecord], None] = lambda _: None,
        poll_seconds: float = WAIT_POLL_SECONDS,
        seconds: float = PURGE_LEASE_SECONDS,
    ) -> PurgeLease:
        """Take the lock, or raise `LockHeldError` (with `wait`: wait until it is free)."""
        lock = RunLock(ledger, clock, runs)
        while True:
            current = lock.current()
            if current is not None and lock.keeps_out(current):
                if not wait:
                    raise LockHeldError(current)
                on_wait(current)
                time.sleep(poll_seconds)
                continue
            record = _purge_record(clock(), seconds)
            if lock.replace(record, over=current):
                return cls(ledger, record, clock, seconds)
            # Someone took it between our look and our write: look again.

    def renew(self) -> None:
        """Extend the lease before the next step; `PurgeError` if it lapsed and was taken over."""
        record = _purge_record(self.clock(), self.seconds, acquired_at=self.record.acquired_at)
        if not RunLock(self.ledger, self.clock).replace(record, over=self.record):
            raise PurgeError(
                f"the purge's lease on the retraining lock ({self.record.holder}) lapsed and was taken over; "
                "run the same purge again to finish"
            )
        self.record = record

    def end(self) -> None:
        """Let the lease lapse now. Never raises: an end that fails lapses by itself within the lease."""
        spent = self.record.model_copy(update={"expires_at": self.clock()})
        try:
            RunLock(self.ledger, self.clock).replace(spent, over=self.record)
        except (ClientError, BotoCoreError):
            return


def _purge_record(now: datetime, seconds: float, acquired_at: datetime | None = None) -> LockRecord:
    holder = f"{PURGE_HOLDER_PREFIX}{now:%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    return LockRecord(holder=holder, acquired_at=acquired_at or now, expires_at=now + timedelta(seconds=seconds))


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
    version_hashes: set[str] = field(default_factory=set)  # of every image version in the bucket
    named_claims: list[tuple[str, str]] = field(default_factory=list)  # content claims naming it

    @property
    def ident(self) -> tuple[str, str]:
        return _ident(self.batch, self.stem, self.key)

    @property
    def found(self) -> bool:
        # A claim alone is found too: an erasure cut short (or an older one) left it behind.
        return bool(self.pair or self.files or self.objects or self.named_claims)

    def image_hashes(self) -> set[str]:
        # Every version's: a superseded version's record keeps no sha256, yet its bytes were claimed.
        hashes = {f.sha256 for f in self.files if f.role is Role.IMAGE and f.sha256} | self.version_hashes
        hashes |= {sha256 for sha256, _ in self.named_claims}
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
        return sorted(claims | set(self.named_claims))


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
        self._s3 = s3
        self._data = DataBucket(s3, bucket)
        self._clock = clock
        self._listings: dict[str, list[ObjectVersion]] = {}
        self._files: dict[str, list[FileRecord]] = {}
        self._pairs: dict[str, list[PairRecord]] = {}
        self._claims: list[tuple[str, str]] | None = None

    # ------------------------------------------------------------ finding --
    def find(self, targets: list[Target]) -> dict[tuple[str, str], _Subject]:
        subjects: dict[tuple[str, str], _Subject] = {}
        for target in targets:
            named = (
                self._batch_subjects(target)
                if target.whole_batch
                else [_Subject(target.batch, target.stem, target.key, target.given, "requested")]
            )
            for subject in named:
                subjects.setdefault(subject.ident, subject)
        for subject in subjects.values():
            self._locate(subject)
        # A photograph uploaded twice is the same photograph: erase every copy of its bytes.
        for copy in self._same_images([s for s in subjects.values() if s.found]):
            subjects.setdefault(copy.ident, copy)
        return subjects

    def _batch_subjects(self, target: Target) -> list[_Subject]:
        """Everything of a batch: every pair and lone file the ledger records, and every object
        under the batch's folders in each zone, recorded or not."""
        batch = target.batch
        stems = {pair.stem for pair in self._batch_pairs(batch)}
        lone: set[str] = set()
        for record in self._batch_files(batch):
            stem = _pair_stem(batch, record.key)
            if stem is not None:
                stems.add(stem)
            else:
                lone.add(record.key)
        folders = [
            f"{prefixes.QUARANTINE}{batch}/",
            *(f"{prefixes.DATASET}{f}/{batch}/" for f in prefixes.PAIR_FOLDERS),
        ]
        if batch != prefixes.UNBATCHED:  # an unbatched file lands straight in incoming/
            folders.append(f"{prefixes.INCOMING}{batch}/")
        for version in (v for folder in folders for v in self._listing(folder)):
            stem = _pair_stem(batch, version.key)
            if stem is not None:
                stems.add(stem)
            elif version.key.startswith(prefixes.QUARANTINE):
                relative = version.key.removeprefix(f"{prefixes.QUARANTINE}{batch}/")
                lone.add(prefixes.landing_key(batch, relative.removesuffix(prefixes.REASON_SUFFIX)))
            elif version.key.startswith(prefixes.INCOMING):
                lone.add(version.key)
        why = f"the whole batch {batch} was requested"
        return [_Subject(batch, stem, None, target.given, why) for stem in sorted(stems)] + [
            _Subject(batch, None, key, target.given, why) for key in sorted(lone)
        ]

    def _locate(self, subject: _Subject) -> None:
        batch = subject.batch
        if subject.stem is not None:
            found = self._ledger.pair(batch, subject.stem)
            subject.pair = found[0] if found else None
            subject.files = [f for f in self._batch_files(batch) if self._is_part(subject, f.key)]
        else:
            subject.files = [f for f in self._batch_files(batch) if f.key == subject.key]
        named = {f.key for f in subject.files} | {f.destination for f in subject.files if f.destination}
        named |= {f.reason_key for f in subject.files if f.reason_key}  # a refused file's lone reason
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
        if subject.stem is not None:
            subject.version_hashes = self._version_hashes(subject)
        subject.named_claims = [claim for claim in self._every_claim() if self._names(subject, claim[1])]

    def _version_hashes(self, subject: _Subject) -> set[str]:
        """The sha256 of every image version of the pair in the bucket: read where no record
        knows it (a version uploaded again is recorded `superseded`, without its hash)."""
        known = {(f.key, f.version): f.sha256 for f in subject.files if f.sha256}
        known |= {
            (f.destination, f.destination_version or "null"): f.sha256
            for f in subject.files
            if f.sha256 and f.destination
        }
        batch, images = subject.batch, prefixes.IMAGES_DIR
        folders = (
            f"{prefixes.INCOMING}{batch}/{images}/",
            f"{prefixes.DATASET}{images}/{batch}/",
            f"{prefixes.QUARANTINE}{batch}/{images}/",
        )
        hashes = set()
        for version in subject.objects:
            image = version.key.startswith(folders) and not version.key.endswith(prefixes.REASON_SUFFIX)
            if version.delete_marker or not image:
                continue
            sha256 = known.get((version.key, version.version_id))
            if sha256 is None:
                try:
                    sha256 = object_sha256(self._s3, self._data.name, version.key, version.version_id)
                except ObjectGoneError:
                    continue  # deleted meanwhile: nothing left to find copies of
            hashes.add(sha256)
        return hashes

    def _every_claim(self) -> list[tuple[str, str]]:
        if self._claims is None:
            self._claims = self._ledger.claims()
        return self._claims

    def _names(self, subject: _Subject, claimed: str) -> bool:
        """Whether a claim's `<batch>/<relative>` is the subject's image (under any of its names)."""
        batch, _, relative = claimed.partition("/")
        landing = prefixes.landing_key(batch, relative)
        if subject.stem is None:
            return batch == subject.batch and landing == subject.key
        return batch == subject.batch and self._is_part(subject, landing)

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

    # ------------------------------------------------------ relabel lists --
    def relabel_pictures(self, subjects: list[_Subject], whole: list[str]) -> list[ObjectVersion]:
        """The pictures beside the batch reports that may show an erased image: every version
        under `fix/` of a batch erased whole; of a batch with erased pairs, every picture its
        relabel list no longer names once they leave it (an older list's pictures too)."""
        found = []
        for batch in sorted({s.batch for s in subjects} | set(whole)):
            kept: set[str] = set()
            if batch not in whole:
                trust = self._ledger.trust(batch)
                listed = _without_erased(trust.to_fix, batch, subjects) if trust else []
                kept = {prefixes.report_key(batch, p.picture) for p in listed if p.picture}
            found += [v for v in self._listing(prefixes.report_key(batch, FIX_PICTURES)) if v.key not in kept]
        return found

    def drop_from_relabel_lists(self, subjects: list[_Subject]) -> None:
        """Erased pairs leave their team's relabel list (the trust item stays: its verdicts are
        kept under digests, which show nothing)."""
        for batch in sorted({s.batch for s in subjects if s.stem is not None}):

            def change(current: BatchTrust, batch: str = batch) -> BatchTrust | None:
                kept = _without_erased(current.to_fix, batch, subjects)
                return None if len(kept) == len(current.to_fix) else current.model_copy(update={"to_fix": kept})

            self._ledger.update_trust(batch, change)

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
        # Where the report was before batch reports had a folder of their own: every version goes.
        # Only those two keys, never the folder: `reports/<batch>/` of a batch named `runs` is
        # every run's evidence.
        legacy = [prefixes.legacy_report_key(batch, name) for name in (REPORT_JSON, REPORT_MARKDOWN)]
        self.delete(v for key in legacy for v in self._listing(key) if v.key == key)
        return folder


def purge(
    ledger: Ledger,
    s3: S3Client,
    bucket: str,
    keys: list[str],
    *,
    dry_run: bool = False,
    clock: Callable[[], datetime] = utc_now,
    runs: Executions | None = None,
    wait: bool = False,
    on_wait: Callable[[LockRecord], None] = lambda _: None,
    poll_seconds: float = WAIT_POLL_SECONDS,
) -> PurgeReport:
    """Erase what `keys` name (see `parse_target`) everywhere; with `dry_run`, only say what. A
    batch named whole loses its trust item last, once nothing of it is left (a held batch
    purged is simply gone: `retrain data held` no longer lists it).

    Raises `PurgeUsageError` before touching anything when a KEY names nothing erasable (or a
    batch the ledger does not know), and
    `LockHeldError` when a run holds the trigger's lock (with `wait`: waits for it, calling
    `on_wait` at each look). `runs` tells a run that ended from one still going.
    """
    if not keys:
        raise PurgeUsageError("name at least one KEY to erase")
    targets = [parse_target(key, bucket) for key in keys]
    for target in targets:
        # A bare word erases a whole batch: one the ledger does not know is a mistyped KEY.
        if target.whole_batch and ledger.batch(target.batch) is None and ledger.trust(target.batch) is None:
            raise PurgeUsageError(
                f"{target.given}: there is no batch {target.batch} in the ledger (a KEY is a batch, "
                "<batch>/<stem>, or an incoming/, dataset/ or quarantine/ key)"
            )
    if dry_run:
        return _purge(ledger, s3, bucket, keys=keys, targets=targets, clock=clock, lease=None)
    lease = PurgeLease.take(ledger, clock=clock, runs=runs, wait=wait, on_wait=on_wait, poll_seconds=poll_seconds)
    try:
        return _purge(ledger, s3, bucket, keys=keys, targets=targets, clock=clock, lease=lease)
    finally:
        lease.end()


def _purge(
    ledger: Ledger,
    s3: S3Client,
    bucket: str,
    *,
    keys: list[str],
    targets: list[Target],
    clock: Callable[[], datetime],
    lease: PurgeLease | None,
) -> PurgeReport:
    """The purge itself; dry without a lease, which is renewed before every step that erases."""
    dry_run = lease is None

    def step() -> None:
        if lease is not None:
            lease.renew()

    at = clock()
    purger = Purger(ledger, s3, bucket, clock)
    subjects = purger.find(targets)
    erasing = [s for s in subjects.values() if s.found]
    # A batch erased whole loses its trust item too: nothing of it is left to trust or hold.
    whole = sorted({t.batch for t in targets if t.whole_batch})
    trusted = [batch for batch in whole if ledger.trust(batch) is not None]
    forgotten = {trust_item(batch) for batch in trusted}
    unmatched = [
        t.given
        for t in targets
        if not (
            (t.batch in trusted or any(s.batch == t.batch for s in erasing))
            if t.whole_batch
            else subjects[_ident(t.batch, t.stem, t.key)].found
        )
    ]
    plans = purger.manifest_plans(erasing)
    # A relabel list's picture shows the image: it goes with the pair.
    pictures = purger.relabel_pictures(erasing, whole)
    objects = _unique([*(o for s in erasing for o in s.objects), *pictures])
    warnings = _warnings(ledger, plans, at)
    ledger_items: list[str] = []
    for subject in erasing:
        step()
        ledger_items += ledger.erase(
            subject.batch,
            stem=subject.stem,
            files=subject.files,
            claims=subject.claims(),
            dry_run=dry_run,
        )
    if not dry_run:
        purger.drop_from_relabel_lists(erasing)
    ledger_items += sorted(forgotten)
    batches = sorted({s.batch for s in erasing})
    report = PurgeReport(
        dry_run=dry_run,
        at=at,
        requested=list(keys),
        unmatched=unmatched,
        batches=whole,
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
    step()
    purger.delete(objects)
    changes = []
    for plan in plans:
        step()
        changes.append(purger.rewrite_manifest(plan, at))
    # A second look: an intake that was mid-way may have written a copy meanwhile.
    step()
    purger.forget()
    late = _unique(o for s in erasing for o in purger.objects_of(s))
    purger.delete(late)
    purger.forget()
    remaining = _unique(o for s in erasing for o in purger.objects_of(s))
    step()
    # Last, and only once nothing is left: a held batch whose purge was cut short stays held (out
    # of every version) until the same purge, run again, finishes.
    if remaining:
        ledger_items = [item for item in ledger_items if item not in forgotten]
    else:
        for batch in trusted:
            ledger.forget_trust(batch)
    return report.model_copy(
        update={
            "objects": _unique([*objects, *late]),
            "ledger_items": ledger_items,
            "manifests": changes,
            "reports": [folder for b in batches if (folder := purger.rewrite_report(b))],
            "remaining": remaining,
        }
    )


def _without_erased(to_fix: list[PairToFix], batch: str, subjects: list[_Subject]) -> list[PairToFix]:
    """`to_fix` without the pairs of `batch` that `subjects` erase (by stem, or by content)."""
    stems = {s.stem for s in subjects if s.batch == batch and s.stem is not None}
    digests = {d for s in subjects if s.batch == batch and s.pair is not None and (d := s.pair.digest)}
    return [p for p in to_fix if PurePosixPath(p.image).stem not in stems and p.digest not in digests]


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


def _pair_stem(batch: str, key: str) -> str | None:
    """The stem of the batch's pair that `key` is a file of (any zone), or None."""
    for folder in prefixes.pair_folders(batch):
        if key.startswith(folder):
            name = key.removeprefix(folder)
            return stem_of(name) if name and "/" not in name else None
    return None


def _ident(batch: str, stem: str | None, key: str | None) -> tuple[str, str]:
    return (batch, stem if stem is not None else f"key:{key}")


def _unique(versions: Iterable[ObjectVersion]) -> list[ObjectVersion]:
    found = {(v.key, v.version_id): v for v in versions}
    return [found[k] for k in sorted(found)]


def _warnings(ledger: Ledger, plans: list[_ManifestPlan], at: datetime) -> list[str]:
    """For a dry run: a run that holds the lock (a purge holds it itself while it erases)."""
    lock = RunLock(ledger, lambda: at).holder()  # no state machine to ask: the lease says
    if lock is None or Ledger.is_purge_holder(lock.holder):
        return []
    found = [f"run {lock.holder} holds the retraining lock: a purge is refused while it runs (or waits for it, --wait)"]
    touched = {_version_of(plan.key) for plan in plans if plan.removed}
    # A rerun's name is not its dataset version; locks written before versions were recorded
    # name only the run, whose name was its version.
    if (lock.dataset_version or lock.holder) in touched:
        found.append(
            f"run {lock.holder} trains on a dataset version that held these files: its FSx copy and "
            "training instances keep them until it ends (stop it to erase them now)"
        )
    return found
