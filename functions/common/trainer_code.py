"""The trainer a run trains with: fixed by its digest when the run starts, checked before its job.

The release path (`retrain package-trainer --stack`, `retrain/package.py`) writes each archive
under its own sha256 (`code/<sha256>/sourcedir.tar.gz`, never overwritten) and then
`code/current.json` naming that digest. PrepareRun reads the release once, so a run keeps the
code it started with whatever is released later; just before CreateTrainingJob the training-job
function hashes the archive again and refuses other bytes (`TrainerCodeMismatchError`). The
bucket policy denies writes under `code/` to everyone but the release path: this check is what
still stands when that policy is loosened, or bypassed by whoever may change it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError
from pydantic import ValidationError

from functions.common import prefixes
from functions.common.errors import TrainerCodeMismatchError, TrainerCodeMissingError
from functions.common.models import TrainerCode, TrainerRelease

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

RELEASE_HINT = "release the trainer (`make upload-trainer STACK=<stack>`, after `sam deploy`)"
CHUNK = 1024 * 1024
_MISSING = {"404", "NoSuchKey"}


def released_trainer(s3: S3Client, bucket: str) -> TrainerCode:
    """The trainer `code/current.json` names; `TrainerCodeMissingError` before the first release."""
    where = f"s3://{bucket}/{prefixes.TRAINER_RELEASE}"
    try:
        body = s3.get_object(Bucket=bucket, Key=prefixes.TRAINER_RELEASE)["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in _MISSING:
            missing = f"no trainer has been released ({where} is missing): {RELEASE_HINT}"
            raise TrainerCodeMissingError(missing) from error
        raise
    try:
        release = TrainerRelease.model_validate_json(body)
    except ValidationError as error:
        raise TrainerCodeMissingError(f"{where} does not name a released trainer: {RELEASE_HINT} again") from error
    return TrainerCode(uri=f"s3://{bucket}/{prefixes.trainer_code_key(release.sha256)}", sha256=release.sha256)


def archive_sha256(s3: S3Client, uri: str) -> str | None:
    """The sha256 of the object at `uri`, read through (S3's own checksums exist only when the
    uploader asked for them, and are composite for multipart uploads); None when it is not there."""
    bucket, key = prefixes.split_s3_uri(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in _MISSING:
            return None
        raise
    digest = hashlib.sha256()
    for chunk in body.iter_chunks(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def verify_trainer_code(s3: S3Client, code: TrainerCode, *, run: str) -> None:
    """Return if the archive at `code.uri` still has the sha256 the run started with; raise
    `TrainerCodeMismatchError` (other bytes) or `TrainerCodeMissingError` (gone), saying what to do."""
    found = archive_sha256(s3, code.uri)
    if found is None:
        raise TrainerCodeMissingError(
            f"the trainer run {run} was started with, {code.uri}, is gone: nothing was trained; {RELEASE_HINT} "
            f"again and start the run again (`retrain runs rerun {run}`)"
        )
    if found != code.sha256:
        raise TrainerCodeMismatchError(
            f"refused to train: {code.uri} has sha256 {found}, but run {run} was started with {code.sha256}. "
            "The released code was replaced after its release; nothing was trained with it. Find out who wrote "
            "it (the data bucket's access logs, CloudTrail), release the trainer again, which restores it "
            f"(`make upload-trainer STACK=<stack>`), and start the run again (`retrain runs rerun {run}`)"
        )
