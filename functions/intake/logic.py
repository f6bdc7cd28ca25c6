"""Intake: every object that lands under incoming/ is checked, paired and given its one fate.

Per object: classify the key; read and check the file; put it on its pair's record; when the
pair is whole, judge it and act: a valid pair is copied to the curated zone, an invalid file is
moved to quarantine with a `.reason.json` beside it, a duplicate is recorded against its original.
Nothing leaves the landing zone before its copy is confirmed. The `_COMPLETE` marker closes its
batch at once; the sweeper (`functions/sweeper/logic.py`) closes the others after a quiet period.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.utilities.data_classes import S3Event
from pydantic import ValidationError

from functions.common import prefixes
from functions.common.errors import (
    ConcurrentUpdateError,
    EncryptionRefusedError,
    InvalidEventError,
    ObjectGoneError,
    RefusedEventError,
)
from functions.common.models import S3ObjectEvent, decode_key, written_before
from functions.data.fates import Bookkeeper, unmovable_reason
from functions.data.ledger import Ledger
from functions.data.models import (
    FileRecord,
    FileStatus,
    PairRecord,
    PairStatus,
    Side,
)
from functions.validation import (
    FileCheck,
    FileChecker,
    KeyKind,
    PairResult,
    Reason,
    ReasonCode,
    RejectedError,
    Role,
    Status,
    ValidationConfig,
    check_batch_safety,
    check_in_process,
    check_landing_key,
    classify_key,
    judge_pair,
)

TEST_EVENT = "s3:TestEvent"
OBJECT_CREATED = "ObjectCreated:"
# What makes an object event "the same": its object version, never when or how it was delivered
# (S3 and SQS both redeliver, with other event times). Powertools Idempotency hashes only these.
OBJECT_VERSION_KEY = "[bucket, key, version_id, etag]"
# Fixed, so that moving the code never makes every object version look new (Powertools' default
# prefix is the function's module and name).
IDEMPOTENCY_KEY_PREFIX = "intake.object-version"
# A conflicting write on a pair is redone in the same invocation this often (each redo reads the
# pair again), with full-jitter backoff from this base: cheaper than a visibility timeout. Six
# attempts wait 1.5 s on average (3.1 s at most): long enough for the invocation it collided with
# to record what it moved, which the redo then reads.
PAIR_UP_ATTEMPTS = 6
CONFLICT_BACKOFF_SECONDS = 0.05


def parse_notification(body: str) -> list[S3ObjectEvent]:
    """Objects named by one S3 notification message; none for S3's `s3:TestEvent`.

    Parsed leniently (Powertools' S3Event data class, not its strict model): moto's records lack
    fields that AWS sends, and neither may cost us an upload.
    """
    try:
        payload: dict[str, Any] = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidEventError(f"message body is not JSON: {body[:200]!r}") from exc
    if payload.get("Event") == TEST_EVENT:
        return []
    if not isinstance(payload.get("Records"), list):
        raise InvalidEventError(f"message has no S3 Records: {body[:200]!r}")
    try:
        return [
            S3ObjectEvent(
                bucket=record.s3.bucket.name,
                key=decode_key(record.s3.get_object.key),
                size=record.s3.get_object.get("size") or 0,
                etag=record.s3.get_object.get("eTag"),
                version_id=record.s3.get_object.get("versionId"),
                sequencer=record.s3.get_object.get("sequencer"),
                event_name=record.event_name,
                event_time=record.get("eventTime"),
            )
            for record in S3Event(payload).records
        ]
    except (KeyError, TypeError, ValidationError) as exc:
        raise InvalidEventError(f"S3 record lacks a required field: {exc}") from exc


@dataclass(kw_only=True)
class Intake(Bookkeeper):
    config: ValidationConfig
    # The Lambda checks files in a child process killed at a time limit (`DecoderProcess`).
    check_file: FileChecker = check_in_process
    pause: Callable[[float], None] = time.sleep
    grown: set[str] = field(default_factory=set)  # batches in which this invocation curated a pair

    def _move_limit(self) -> int:
        return self.config.max_file_bytes

    def finish(self) -> None:
        """At the end of an invocation: rewrite the reports of the closed batches it touched, and
        ask the trigger to look if it closed one, or curated pairs into one already closed (the
        trigger decides whether a run starts).

        S3 and SQS keep no order, so a batch's `_COMPLETE` marker, uploaded last, is often
        processed before some of its pairs: the trigger that the close asked then finds too few
        new pairs, and without a second look the rest would wait for the schedule (hours)."""
        reported = self.report_closed()
        if self.newly_closed:
            self.kick("batch closed")
        elif self.grown & set(reported):
            self.kick("pairs curated after their batch closed")

    def objects_in(self, message_body: str) -> list[S3ObjectEvent]:
        """The object versions one SQS message of S3 notifications names.

        moto's events carry no versionId, AWS's do: look it up before anything keys on it, so
        idempotency is per object version either way.
        """
        return [
            event
            if event.version_id is not None or self.refusal(event) is not None
            else event.model_copy(update={"version_id": self.bucket.current_version(event.key)})
            for event in parse_notification(message_body)
        ]

    def refusal(self, obj: S3ObjectEvent) -> str | None:
        """Why the intake must not act on this event, or None. The bucket notifies only on
        `incoming/` object creations, so anything else is forged or misrouted: acting on it would
        let a message "quarantine" (delete) a manifest, or touch another bucket."""
        if obj.bucket != self.bucket.name:
            return f"it names bucket {obj.bucket!r}, not this intake's {self.bucket.name!r}"
        if not obj.event_name.startswith(OBJECT_CREATED):
            return f"it is a {obj.event_name} event, not an object creation"
        if not obj.key.startswith(prefixes.INCOMING):
            return f"its key {obj.key!r} is outside {prefixes.INCOMING}"
        return None

    def process(self, obj: S3ObjectEvent) -> FileStatus:
        refusal = self.refusal(obj)
        if refusal is not None:
            raise RefusedEventError(f"s3://{obj.bucket}/{obj.key} refused: {refusal}")
        batch = _ledger_batch(obj)
        relative = prefixes.relative_to_batch(obj.key)
        self._touch(batch)
        # Every fate is recorded against the object version (an unversioned bucket: the ETag).
        version = obj.version_id or obj.etag or "null"
        try:
            check_landing_key(obj.key)
        except RejectedError as error:
            # An unsafe batch folder or a key too long for what is derived from it: never read,
            # and set aside under a key that is neither (nothing is lost on bad input).
            reason = Reason.from_error(error, obj.key)
            return self._quarantine(
                batch, obj.key, version, [reason], destination=prefixes.unsafe_quarantine_key(obj.key)
            )
        try:
            kind = classify_key(relative, self.config)
        except RejectedError as error:
            # An unsafe name is not reused as a quarantine key (`..` in it would climb out of
            # quarantine/ once synced to a disk); other refused layouts keep their own names.
            unsafe = error.code is ReasonCode.UNSAFE_NAME
            destination = prefixes.unsafe_quarantine_key(obj.key) if unsafe else None
            reason = Reason.from_error(error, relative)
            return self._quarantine(batch, obj.key, version, [reason], destination=destination)
        if kind.kind is KeyKind.MARKER:
            self._close(batch, "marker")
            self._record(batch, obj.key, version, FileStatus.MARKER)
            return FileStatus.MARKER
        role = Role.IMAGE if kind.kind is KeyKind.IMAGE else Role.LABEL
        pinned = None if version == "null" else version
        try:
            body, _ = self.bucket.read(obj.key, pinned, self.config.max_file_bytes)
        except ObjectGoneError:
            held = self._held_by_unfinished_judgement(batch, kind.stem, role, obj.key, version)
            if held is not None:
                # A judgement died between its copies: this version was copied and its landing copy
                # removed. The pair item still holds its check, so the judgement is finished from it.
                return self._pair_up_again_on_conflict(batch, kind.stem, role, held)
            record = self.ledger.file(batch, obj.key, version)
            if record is not None and record.status is not FileStatus.PENDING:
                return record.status  # delivered again after its fate was sealed: nothing to do
            raise  # erased, or withdrawn by its uploader, before anything was done with it
        except EncryptionRefusedError as refused:
            # Unreadable to us (or encrypted as the bucket forbids): a broken file like any other,
            # whose partner must learn so; it is refused where it lies (`_quarantine`).
            reason = unmovable_reason(refused, relative)
            check = FileCheck(key=relative, role=role, size_bytes=obj.size, reasons=(reason,))
        else:
            check = self.check_file(role, body, relative, self.config)
        side = Side(key=obj.key, version=version, check=check, sequencer=obj.sequencer)
        # Even a broken file joins its pair: its partner must learn that it was rejected.
        return self._pair_up_again_on_conflict(batch, kind.stem, role, side)

    def _pair_up_again_on_conflict(self, batch: str, stem: str, role: Role, side: Side) -> FileStatus:
        """Pair up; when another invocation changed the pair meanwhile (its partner, or another
        version of this file, arriving at the same moment: common, as both halves of a pair are
        uploaded together), read it again and redo, a few times, before SQS's redelivery has to.

        A version this judgement moves can also leave the landing zone under it: a correction
        uploaded seconds later supersedes it (removing it by VersionId), or a judgement of the
        same pair running beside this one copied it first. Both are the pair changing meanwhile,
        and the redo reads what became of it in the ledger.
        """
        for attempt in range(1, PAIR_UP_ATTEMPTS + 1):
            try:
                return self._pair_up(batch, stem, role, side)
            except ConcurrentUpdateError:
                if attempt == PAIR_UP_ATTEMPTS:
                    raise  # a hot pair: the message comes back after the visibility timeout
            except ObjectGoneError as gone:
                if attempt == PAIR_UP_ATTEMPTS:
                    # Not left to escape as "gone", which drops the message: SQS brings it back,
                    # and the ledger then says what became of the version (or that it was erased).
                    raise ConcurrentUpdateError(f"pair {batch}/{stem} kept changing while judged: {gone}") from gone
            # Full jitter: the invocations that collided must not collide again in step.
            self.pause(random.uniform(0, CONFLICT_BACKOFF_SECONDS * 2**attempt))  # noqa: S311 (not crypto)
        raise AssertionError("unreachable")

    def _held_by_unfinished_judgement(self, batch: str, stem: str, role: Role, key: str, version: str) -> Side | None:
        found = self.ledger.pair(batch, stem)
        if found is None or found[0].status is not PairStatus.JUDGING:
            return None
        side = found[0].side(role)
        return side if side is not None and (side.key, side.version) == (key, version) else None

    # ------------------------------------------------------------ batches --
    def _touch(self, batch: str) -> None:
        # A late object of a closed batch still belongs to it (its report is rewritten), and of a
        # consumed one brings it back to the trigger's list of closed batches.
        self.ledger.touch_batch(batch, self.clock())
        self.touched.add(batch)

    # -------------------------------------------------------------- pairs --
    def _pair_up(self, batch: str, stem: str, role: Role, side: Side) -> FileStatus:
        found = self.ledger.pair(batch, stem)
        if found is None:
            pair, revision = PairRecord(batch=batch, stem=stem, first_seen=self.clock()), 0
        else:
            pair, revision = found
        previous = pair.side(role)
        update: dict[str, Any] = {role.value: side, "status": PairStatus.PENDING}
        if previous is not None and (previous.key, previous.version) == (side.key, side.version):
            if pair.status not in {PairStatus.PENDING, PairStatus.JUDGING}:
                return _file_status(pair.status)  # a redelivery of what is already judged
            # PENDING or JUDGING: a judgement that died half-way is simply done again.
        elif previous is not None and written_before(side.sequencer, previous.sequencer):
            # An older version of this key, delivered after the newer one (S3 and SQS keep no
            # order): it never replaces what the pair holds. Its landing copy goes, by VersionId.
            self._record(batch, side.key, side.version, FileStatus.SUPERSEDED, role=role, check=side.check)
            self.bucket.remove(side.key, side.version)
            return FileStatus.SUPERSEDED
        elif previous is not None:
            # The same name uploaded again: the newer version replaces the older one, and the
            # pair is new data again for the next dataset version.
            self._record(batch, previous.key, previous.version, FileStatus.SUPERSEDED, role=role)
            # A version still waiting for its partner is still in the landing zone: with the newer
            # one removed by VersionId once copied, it would become the key's latest again and
            # look like a fresh upload. Deleting a version that was already copied or quarantined
            # (and so removed) is a no-op for S3.
            self.bucket.remove(previous.key, previous.version)
            update["dataset_version"] = None
            # The curated copy was the older version's: this side is to be curated again.
            update[f"{role.value}_destination"] = None
            update[f"{role.value}_destination_version"] = None
        pair = pair.model_copy(update=update)
        whole = pair.image is not None and pair.label is not None
        if whole:
            pair = pair.model_copy(update={"status": PairStatus.JUDGING})
        elif side.check.reasons:
            # Broken on its own: no partner can save it (and the sweeper must not wait for one).
            pair = pair.model_copy(update={"status": PairStatus.INVALID})
        self.ledger.put_pair(pair, revision + 1)  # the conditional write is the claim to judge
        if not whole:
            if side.check.reasons:
                return self._quarantine(
                    batch,
                    side.key,
                    side.version,
                    list(side.check.reasons),
                    role=role,
                    check=side.check,
                )
            self._record(batch, side.key, side.version, FileStatus.PENDING, role=role, check=side.check)
            return FileStatus.PENDING
        pair, fate = self._judge(pair, arrived=side)
        self.ledger.put_pair(pair, revision + 2)
        if pair.status is PairStatus.VALID:
            # New data exists only from here on. Had the trigger consumed the batch since this
            # object's first touch (a judgement slower than the settle period), this brings it back.
            self._touch(batch)
            self.grown.add(batch)
        return fate or _file_status(pair.status)

    def _judge(self, pair: PairRecord, arrived: Side) -> tuple[PairRecord, FileStatus | None]:
        """The judged pair, and the fate of the arrived file where it is not the pair's (refused)."""
        assert pair.image is not None and pair.label is not None
        result = judge_pair(
            pair.stem,
            pair.image.check,
            pair.label.check,
            taxonomy=self.config.taxonomy,
            index=_BatchScopedIndex(self.ledger, pair.batch),
        )
        if result.status is Status.VALID:
            return self._curate(pair, result), None
        status = FileStatus.DUPLICATE if result.status is Status.DUPLICATE else FileStatus.QUARANTINED
        fate = None
        for role, side in ((Role.IMAGE, pair.image), (Role.LABEL, pair.label)):
            if side != arrived and side.check.reasons:
                continue  # quarantined when it arrived, broken on its own
            if self._set_aside(pair.batch, side) is not None:
                # Quarantined with an earlier partner, or by this judgement before it died half-way:
                # it stays there (its landing copy is gone).
                continue
            if _curated(pair, role):
                # Curated with its earlier partner (which the new upload superseded): that version's
                # fate is sealed, and its landing copy is gone. Only the new upload is set aside.
                continue
            # A file set aside because of its partner carries the pair's reasons.
            own = [r for r in result.reasons if r.key in (None, side.check.key)]
            recorded = self._quarantine(
                pair.batch,
                side.key,
                side.version,
                own or list(result.reasons),
                status=status,
                role=role,
                check=side.check,
                duplicate_of=result.duplicate_of,
            )
            if side == arrived:
                fate = recorded
        pair_status = PairStatus.DUPLICATE if status is FileStatus.DUPLICATE else PairStatus.INVALID
        return pair.model_copy(update={"status": pair_status, "duplicate_of": result.duplicate_of}), fate

    def _curate(self, pair: PairRecord, result: PairResult) -> PairRecord:
        update: dict[str, Any] = {
            "status": PairStatus.VALID,
            "class_pixels": dict(result.class_pixels or {}),
        }
        for role in (Role.IMAGE, Role.LABEL):
            side = pair.side(role)
            assert side is not None
            if _curated(pair, role):
                # Its partner was uploaded again: this version is already in dataset/, and its
                # landing copy was removed then (nothing to copy, nothing to record again).
                continue
            destination = prefixes.curated_key(pair.batch, side.check.key)
            record = self.ledger.file(pair.batch, side.key, side.version)
            if record is not None and record.status is FileStatus.CURATED and record.destination == destination:
                # Copied by this judgement before it died half-way: recorded, and its landing copy
                # removed. What was confirmed then is what the pair keeps.
                update[f"{role.value}_destination"] = destination
                update[f"{role.value}_destination_version"] = record.destination_version
                continue
            held = _set_aside(record)
            if held is None:
                copied = self.bucket.copy(side.key, side.version, destination)
                self.bucket.remove(side.key, side.version)  # only now: the copy above is confirmed
            else:
                # Set aside with an earlier partner (rejected, a duplicate, or never came): its
                # landing copy is gone, so it is curated from quarantine, which then lets it go.
                quarantined, quarantined_version = held
                copied = self.bucket.copy(quarantined, quarantined_version, destination)
                self.bucket.remove(quarantined, quarantined_version)
                reason = prefixes.reason_key(quarantined)
                self.bucket.delete_versions(v for v in self.bucket.versions(reason) if v.key == reason)
            update[f"{role.value}_destination"] = destination
            update[f"{role.value}_destination_version"] = copied
            self._record(
                pair.batch,
                side.key,
                side.version,
                FileStatus.CURATED,
                role=role,
                check=side.check,
                destination=destination,
                destination_version=copied,
            )
        return pair.model_copy(update=update)

    # -------------------------------------------------------- quarantine --
    def _set_aside(self, batch: str, side: Side) -> tuple[str, str | None] | None:
        """Where this version's quarantine copy is, if it was quarantined (its landing copy is
        then gone): a file set aside because of its partner can be judged again with a new one."""
        return _set_aside(self.ledger.file(batch, side.key, side.version))


@dataclass(frozen=True)
class _BatchScopedIndex:
    """Claims content under `<batch>/<key>`: the same file name in two batches is two files."""

    ledger: Ledger
    batch: str

    def claim(self, sha256: str, key: str) -> str | None:
        return self.ledger.claim(sha256, f"{self.batch}/{key}")


def _ledger_batch(obj: S3ObjectEvent) -> str:
    """The batch an object is recorded under: its folder, `_unbatched` without one, `_unsafe`
    when the folder is unsafe. An unsafe folder never becomes a ledger partition or a report
    folder (`reports/../report.json`); the record keeps the object's whole key."""
    if obj.batch is None:
        return prefixes.UNBATCHED
    try:
        check_batch_safety(obj.batch)
    except RejectedError:
        return prefixes.UNSAFE
    return obj.batch


def _set_aside(record: FileRecord | None) -> tuple[str, str | None] | None:
    """The quarantine copy (key, version) a file record names, if it was quarantined."""
    if record is None or record.status not in {FileStatus.QUARANTINED, FileStatus.DUPLICATE}:
        return None
    if record.destination is None:
        return None
    return record.destination, record.destination_version


def _curated(pair: PairRecord, role: Role) -> bool:
    """This side's current version has been copied to dataset/ (a replaced side is cleared)."""
    return (pair.image_destination if role is Role.IMAGE else pair.label_destination) is not None


def _file_status(status: PairStatus) -> FileStatus:
    return {
        PairStatus.VALID: FileStatus.CURATED,
        PairStatus.DUPLICATE: FileStatus.DUPLICATE,
        PairStatus.INVALID: FileStatus.QUARANTINED,
    }.get(status, FileStatus.PENDING)
