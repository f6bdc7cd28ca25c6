"""Check the dataset version a run was started for, and describe it for the later states."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from functions.common import prefixes
from functions.common.errors import DatasetVersionNotFoundError, InvalidRunInputError
from functions.common.models import RunContext, RunInput

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def parse_run_input(event: dict[str, Any]) -> RunInput:
    try:
        return RunInput.model_validate(event)
    except ValidationError as exc:
        raise InvalidRunInputError(
            f"the run input must name a dataset version: {exc.errors(include_url=False)}"
        ) from exc


def prepare_run(run: RunInput, *, s3: S3Client, bucket: str) -> RunContext:
    key = prefixes.manifest_key(run.dataset_version)
    try:
        manifest = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            raise DatasetVersionNotFoundError(
                f"dataset version {run.dataset_version!r} has no manifest at s3://{bucket}/{key}"
            ) from exc
        raise
    # A manifest line is one pair; blank lines (a trailing newline) are not.
    pair_count = sum(1 for line in manifest["Body"].iter_lines() if line.strip())
    return RunContext(
        dataset_version=run.dataset_version,
        manifest_uri=f"s3://{bucket}/{key}",
        manifest_version_id=manifest.get("VersionId"),
        pair_count=pair_count,
    )
