"""Check the dataset version a run was started for, and describe it for the later states: its
size, the run's name, and the accepted model the run starts from and is compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from functions.common import prefixes
from functions.common.errors import DatasetVersionNotFoundError, InvalidRunInputError
from functions.common.models import AcceptedModel, RunContext, RunInput

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def parse_run_input(event: dict[str, Any]) -> RunInput:
    """The execution's input (`input`, as the state machine passes it, or the bare input) with
    the execution's name and start time."""
    given = event.get("input", event) if isinstance(event.get("input", event), dict) else {}
    context = {key: event[key] for key in ("execution", "started_at") if key in event}
    try:
        return RunInput.model_validate({**given, **context})
    except ValidationError as exc:
        raise InvalidRunInputError(
            f"the run input must name a dataset version: {exc.errors(include_url=False)}"
        ) from exc


def prepare_run(
    run: RunInput, *, s3: S3Client, bucket: str, poll_seconds: int = 60, poll_max_seconds: int = 300
) -> RunContext:
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
        run=run.execution or run.dataset_version,
        dataset_version=run.dataset_version,
        manifest_uri=f"s3://{bucket}/{key}",
        manifest_version_id=manifest.get("VersionId"),
        pair_count=pair_count,
        started_at=run.started_at,
        poll_seconds=poll_seconds,
        poll_max_seconds=poll_max_seconds,
        accepted=accepted_model(s3, bucket),
    )


def accepted_model(s3: S3Client, bucket: str) -> AcceptedModel | None:
    """`models/accepted.json`, or None before the first model was accepted."""
    try:
        body = s3.get_object(Bucket=bucket, Key=prefixes.ACCEPTED_MODEL)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            return None
        raise
    return AcceptedModel.model_validate_json(body)
