"""Check the dataset version a run was started for, and describe it for the later states: its
size, the run's name, the accepted model the run starts from and is compared with, and the
released trainer (its sha256) that the run's job must run (`functions/common/trainer_code.py`).

The first state of every execution also makes sure its execution holds the run lock: one the
trigger started holds it already; one an operator started by hand (StartExecution) takes a free
lock as the trigger would; one that would train beside another run is refused by name
(`LockHeldByAnotherRunError`), before anything was created for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.common.errors import (
    ConcurrentUpdateError,
    DatasetVersionNotFoundError,
    InvalidRunInputError,
    LockHeldByAnotherRunError,
)
from functions.common.models import AcceptedModel, RunContext
from functions.common.requests import RunInput
from functions.common.trainer_code import released_trainer
from functions.data.ledger import Ledger
from functions.data.models import LockRecord
from functions.data.run_lock import RunLock

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

LOCK_TRIES = 3  # looks at the lock when others keep changing it between a look and a write


@dataclass(frozen=True)
class RunLockGuard:
    """This execution holds the run lock, or it does not run (`functions/data/run_lock.py`)."""

    lock: RunLock
    ttl_seconds: int

    def hold(self, execution: str, dataset_version: str | None = None) -> None:
        """Return once `execution` holds the lock: it did already (the trigger or `retrain runs
        rerun` took it for it), or it took a free one. Raise `LockHeldByAnotherRunError` while
        another execution that is RUNNING, or a purge, holds it."""
        for _ in range(LOCK_TRIES):
            lock = self.lock.current()
            if lock is not None and lock.holder == execution:
                return
            if lock is not None and self.lock.keeps_out(lock):
                raise LockHeldByAnotherRunError(_refusal(lock, execution))
            if self.lock.take(execution, self.ttl_seconds, over=lock, dataset_version=dataset_version) is not None:
                return
            # Another holder took it between our look and our write: look again.
        raise ConcurrentUpdateError(f"the run lock kept changing while execution {execution} tried to take it")


def _refusal(lock: LockRecord, execution: str) -> str:
    if Ledger.is_purge_holder(lock.holder):
        return (
            f"a purge ({lock.holder}) holds the retraining lock until {lock.expires_at:%Y-%m-%d %H:%M:%S} UTC: "
            f"this execution ({execution}) would train on data being erased; start it again when the purge "
            "has ended, or use `retrain runs rerun`"
        )
    return (
        f"run {lock.holder} holds the retraining lock: this execution ({execution}) would train beside it; "
        f"start it again when {lock.holder} has ended, or use `retrain runs rerun`"
    )


@dataclass(frozen=True)
class RunPreparer:
    s3: S3Client
    bucket: str
    poll_seconds: int  # the first wait of every polling loop of the run
    poll_max_seconds: int
    notify_on_start: bool = False
    # The run lock every execution must hold; None only where a test looks at the sizing alone.
    lock: RunLockGuard | None = None

    def prepare(self, run: RunInput) -> RunContext:
        bucket = self.bucket
        key = prefixes.manifest_key(run.dataset_version)
        try:
            manifest = self.s3.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                raise DatasetVersionNotFoundError(
                    f"dataset version {run.dataset_version!r} has no manifest at s3://{bucket}/{key}"
                ) from exc
            raise
        if self.lock is not None:
            if run.execution is None:
                raise InvalidRunInputError(
                    "no execution name: a run's first state is passed $$.Execution.Name, the holder the "
                    "run lock must name; start runs through the state machine"
                )
            self.lock.hold(run.execution, run.dataset_version)
        lines = [raw for raw in manifest["Body"].iter_lines() if raw.strip()]
        images = _images(lines)
        # Fixed now: a release during the run does not change what the run trains with.
        code = released_trainer(self.s3, bucket)
        accepted = accepted_model(self.s3, bucket)
        new = _new_since(self.s3, bucket, accepted, images)
        return RunContext(
            run=run.execution or run.dataset_version,
            execution_arn=run.execution_arn,
            dataset_version=run.dataset_version,
            manifest_uri=f"s3://{bucket}/{key}",
            manifest_version_id=manifest.get("VersionId"),
            pair_count=len(lines),  # a manifest line is one pair
            new_pairs=len(new),
            new_batches=sorted({batch for batch, _ in new}),
            started_at=run.started_at,
            poll_seconds=self.poll_seconds,
            poll_max_seconds=self.poll_max_seconds,
            notify_on_start=self.notify_on_start,
            accepted=accepted,
            code=code,
        )


def _images(lines: Iterable[bytes]) -> set[tuple[str, str]]:
    """(batch, image path) of every pair of a manifest; blank lines (a trailing newline) are none."""
    found = set()
    for raw in lines:
        if raw.strip():
            entry = json.loads(raw)
            found.add((str(entry.get("batch", "")), str(entry.get("image", ""))))
    return found


def _new_since(
    s3: S3Client, bucket: str, accepted: AcceptedModel | None, images: set[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The pairs the accepted model was not trained on (all of them for the first run)."""
    if accepted is None:
        return images
    try:
        before = s3.get_object(Bucket=bucket, Key=prefixes.manifest_key(accepted.dataset_version))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            return images  # that version was purged: every pair counts as new
        raise
    return images - _images(before["Body"].iter_lines())


def accepted_model(s3: S3Client, bucket: str) -> AcceptedModel | None:
    """`models/accepted.json`, or None before the first model was accepted."""
    try:
        body = s3.get_object(Bucket=bucket, Key=prefixes.ACCEPTED_MODEL)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            return None
        raise
    return AcceptedModel.model_validate_json(body)
