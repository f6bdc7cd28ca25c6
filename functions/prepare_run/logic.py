"""Check the dataset version a run was started for, and describe it for the later states: its
size, the run's name, and the accepted model the run starts from and is compared with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.common.errors import DatasetVersionNotFoundError
from functions.common.models import AcceptedModel, RunContext
from functions.common.requests import RunInput

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass(frozen=True)
class RunPreparer:
    s3: S3Client
    bucket: str
    poll_seconds: int  # the first wait of every polling loop of the run
    poll_max_seconds: int
    notify_on_start: bool = False

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
        lines = [raw for raw in manifest["Body"].iter_lines() if raw.strip()]
        images = _images(lines)
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
