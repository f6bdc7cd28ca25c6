"""When to retrain, and starting exactly one run: the trigger policy, the lock and the freeze.

A retraining starts when closed, settled batches hold at least `min_new_pairs` curated pairs no
run has seen, or at least one such pair whose batch closed more than `max_delay_seconds` ago.
Starting freezes a dataset version (a manifest of every curated pair of settled batches, pinned
by S3 VersionId and sha256) and starts the state machine with the version as execution name, all
under the run lock (`functions/data/run_lock.py`, its one rule). A lock whose run is not running
(finished, killed, or never started) is taken over, so a lost run cannot block retraining
forever; one whose run is RUNNING is not, even after its lease expired.

A settled batch whose curated pairs are all in a dataset version is consumed (it leaves the
ledger's list of closed batches), so deciding reads only the batches that may hold new pairs,
however many came before. A late object brings its batch back (`Ledger.touch_batch`).

Every manifest entry carries its pair's trust (`ManifestEntry.trust`, from the ledger's verdict on
that pair's content) and its team; a held pair is in no version until it is fixed (a new label is
a new pair) or a person releases it, and it starts nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.common.contracts import ManifestEntry, dump_manifest, split_for, team_of
from functions.common.errors import DatasetVersionNotFoundError
from functions.common.requests import RunInput, TriggerInput, TriggerOutcome
from functions.common.settings import LOCK_TTL_SECONDS
from functions.common.taxonomy import Taxonomy
from functions.data.ledger import Ledger
from functions.data.models import BatchRecord, BatchTrust, PairRecord, PairStatus, Trust
from functions.data.run_lock import Executions, RunLock
from functions.data.storage import DataBucket

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient


@dataclass(frozen=True)
class TriggerPolicy:
    min_new_pairs: int = 500
    max_delay_seconds: int = 6 * 3600
    settle_seconds: int = 60  # no object of a closed batch for this long: its events are in
    lock_ttl_seconds: int = LOCK_TTL_SECONDS
    val_fraction: float = 0.1


@dataclass(frozen=True)
class Decision:
    start: bool
    reason: str
    new_pairs: int


def decide(
    new_pairs: list[PairRecord],
    batches: dict[str, BatchRecord],
    now: datetime,
    policy: TriggerPolicy,
    requested_by: str | None = None,
) -> Decision:
    """The policy alone: pure, so every threshold is tested without AWS. A person's request
    (`requested_by`) waives the count and the delay, nothing else: no new pair, no run."""
    count = len(new_pairs)
    if count == 0:
        return Decision(False, "no new curated pairs in closed batches", 0)
    if requested_by is not None:
        return Decision(True, f"{count} new pairs, started on request by {requested_by}", count)
    if count >= policy.min_new_pairs:
        return Decision(True, f"{count} new pairs (threshold {policy.min_new_pairs})", count)
    oldest = min(batches[p.batch].closed_at or now for p in new_pairs)
    waited = (now - oldest).total_seconds()
    if waited >= policy.max_delay_seconds:
        return Decision(
            True,
            f"{count} new pairs, the oldest waiting {waited:.0f} s (delay {policy.max_delay_seconds} s)",
            count,
        )
    return Decision(
        False,
        f"{count} new pairs, below {policy.min_new_pairs}; oldest waiting {waited:.0f} s",
        count,
    )


@dataclass
class Trigger:
    ledger: Ledger
    bucket: DataBucket
    sfn: SFNClient
    state_machine_arn: str
    taxonomy: Taxonomy
    policy: TriggerPolicy
    clock: Callable[[], datetime]

    def handle(self, request: TriggerInput) -> TriggerOutcome:
        """Look for data ready to train on (a person's `start` waives the count and the delay)."""
        return self.run(requested_by=request.source if request.action == "start" else None)

    def run(self, requested_by: str | None = None) -> TriggerOutcome:
        now = self.clock()
        lock = self.lock.current()
        if lock is not None and self.lock.keeps_out(lock):
            return TriggerOutcome(started=None, reason=f"a run holds the lock: {lock.holder}")
        revisions: dict[str, int] = {}
        settled: dict[str, BatchRecord] = {}
        settling = 0
        for batch, revision in self.ledger.closed_batches():
            if (now - batch.last_seen).total_seconds() >= self.policy.settle_seconds:
                settled[batch.batch], revisions[batch.batch] = batch, revision
            else:
                settling += 1
        # Held pairs are in no version until fixed or released (`retrain data release`).
        trusts = self.ledger.trusts()
        # New pairs can only be in closed batches not yet consumed: read those batches' pairs alone.
        new = [
            pair
            for name in settled
            for pair in self.ledger.pairs(name)
            if pair.status is PairStatus.VALID
            and pair.dataset_version is None
            and _trust(trusts, pair) is not Trust.HELD
        ]
        holding_new = {pair.batch for pair in new}
        self._consume([(settled[name], revisions[name]) for name in settled if name not in holding_new])
        decision = decide(new, settled, now, self.policy, requested_by)
        if not decision.start:
            if settling and requested_by is not None:
                # Whoever asked should know that waiting a minute may change the answer.
                return TriggerOutcome(
                    started=None,
                    reason=f"{decision.reason}; {settling} closed batch(es) still settling (an object "
                    f"arrived less than {self.policy.settle_seconds} s ago): ask again after that",
                )
            return TriggerOutcome(started=None, reason=decision.reason)
        # The manifest is cumulative: only starting a run reads every curated pair there is.
        curated = [
            p
            for p in self.ledger.valid_pairs()
            if (p.batch in settled or p.dataset_version) and _trust(trusts, p) is not Trust.HELD
        ]
        entries = [self._entry(pair, _trust(trusts, pair)) for pair in sorted(curated, key=lambda p: (p.batch, p.stem))]
        splits = {entry.split for entry in entries}
        if splits != {"train", "val"}:
            # A model can be neither trained nor judged without both: wait for more data.
            missing = "validation" if "val" not in splits else "training"
            return TriggerOutcome(
                started=None,
                reason=f"{decision.reason}, but no pair is in the {missing} split yet "
                f"(val_fraction {self.policy.val_fraction}): waiting for more data",
            )
        version = _version_name(now, entries)
        if self.lock.take(version, self.policy.lock_ttl_seconds, over=lock, dataset_version=version) is None:
            return TriggerOutcome(started=None, reason="another trigger took the lock first")
        self.bucket.put_text(prefixes.manifest_key(version), dump_manifest(entries), "application/x-ndjson")
        self._start(version, version)
        # Marked once the run exists: a crash before this re-offers the pairs, never loses them.
        for pair in new:
            found = self.ledger.pair(pair.batch, pair.stem)
            if found is not None:
                record, revision = found
                self.ledger.put_pair(record.model_copy(update={"dataset_version": version}), revision + 1)
        self._consume([(settled[name], revisions[name]) for name in sorted(holding_new)])
        return TriggerOutcome(started=version, reason=decision.reason)

    def rerun(self, dataset_version: str, run: str) -> TriggerOutcome:
        """Start `run` on a version frozen before, under the lock every run takes (an operator's
        `retrain runs rerun`): refused while another run holds it, as a new drop would wait."""
        if self.bucket.current_version(prefixes.manifest_key(dataset_version)) is None:
            raise DatasetVersionNotFoundError(
                f"dataset version {dataset_version} has no manifest at {prefixes.manifest_key(dataset_version)}"
            )
        lock = self.lock.current()
        if lock is not None and self.lock.keeps_out(lock):
            return TriggerOutcome(started=None, reason=f"a run holds the lock: {lock.holder}")
        if self.lock.take(run, self.policy.lock_ttl_seconds, over=lock, dataset_version=dataset_version) is None:
            return TriggerOutcome(started=None, reason="another run took the lock first")
        self._start(run, dataset_version)
        return TriggerOutcome(started=run, reason=f"a rerun of dataset version {dataset_version}")

    @cached_property
    def lock(self) -> RunLock:
        return RunLock(self.ledger, self.clock, Executions(self.sfn, self.state_machine_arn))

    def _consume(self, batches: list[tuple[BatchRecord, int]]) -> None:
        """Consume batches whose curated pairs, as read, are all in a dataset version. One that an
        object reached since (its `last_seen` moved) stays closed for the next look."""
        for batch, revision in batches:
            self.ledger.consume_batch(batch, revision)

    def _start(self, name: str, version: str) -> None:
        try:
            self.sfn.start_execution(
                stateMachineArn=self.state_machine_arn,
                name=name,
                input=RunInput(dataset_version=version).model_dump_json(exclude_none=True),
            )
        except ClientError as error:
            # Same name and input while running succeeds on AWS; anything else is a real error.
            if error.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
                raise

    def _entry(self, pair: PairRecord, trust: Trust | None) -> ManifestEntry:
        assert pair.image is not None and pair.label is not None
        assert pair.image.check.sha256 is not None and pair.label.check.sha256 is not None
        ids = {name: str(index) for index, name in enumerate(self.taxonomy.classes)}
        return ManifestEntry(
            image=(pair.image_destination or "").removeprefix(prefixes.DATASET),
            label=(pair.label_destination or "").removeprefix(prefixes.DATASET),
            image_sha256=pair.image.check.sha256,
            label_sha256=pair.label.check.sha256,
            image_version_id=pair.image_destination_version,
            label_version_id=pair.label_destination_version,
            split=split_for(pair.image.check.sha256, self.policy.val_fraction),
            class_pixels={ids[name]: count for name, count in pair.class_pixels.items() if name in ids},
            batch=pair.batch,
            trust=trust.value if trust is not None else "new",
            team=team_of(pair.batch),
        )


def _trust(trusts: dict[str, BatchTrust], pair: PairRecord) -> Trust | None:
    """The verdict on this pair's content; None (new) when there is none for it."""
    record, digest = trusts.get(pair.batch), pair.digest
    return record.of(digest) if record is not None and digest is not None else None


def _version_name(now: datetime, entries: list[ManifestEntry]) -> str:
    """`ds-<UTC time>-<content hash>`: a valid execution name that says when and what."""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry.image}@{entry.image_version_id}:{entry.label}@{entry.label_version_id}\n".encode())
    return f"ds-{now:%Y%m%d-%H%M%S}-{digest.hexdigest()[:8]}"
