"""Reading a finished job's archives straight from S3, member by member, and sealing the model.

`output.tar.gz` grows with the job (the profiler's files of every host): it is streamed and only
the members evaluation needs are kept, each up to a size limit, so a day-long job's archive never
has to fit in a Lambda's memory or disk.

An accepted model is registered from a sealed copy, not from `training/<job>/`, where any later
job may write (`seal`).
"""

from __future__ import annotations

import base64
import hashlib
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from functions.common.errors import AwsServiceBusyError, EvidenceConflictError, RunArtifactsMissingError
from functions.common.prefixes import split_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MEMBER_LIMIT_BYTES = 256 * 1024 * 1024


def read_members(
    s3: S3Client,
    uri: str,
    wanted: set[str],
    *,
    required: bool = True,
    limit: int = MEMBER_LIMIT_BYTES,
    prefixes: tuple[str, ...] = (),
) -> tuple[dict[str, bytes], str | None]:
    """The `wanted` members (names relative to the archive root), and those under `prefixes`,
    and the archive's VersionId.

    A missing archive raises `RunArtifactsMissingError` when `required`, else reads as empty.
    """
    bucket, key = split_s3_uri(uri)
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"} and not required:
            return {}, None
        if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            raise RunArtifactsMissingError(f"{uri} is not there: the job wrote no such archive") from error
        raise
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=response["Body"], mode="r|gz") as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if (name not in wanted and not name.startswith(prefixes)) or not member.isfile():
                continue
            if member.size > limit:
                raise RunArtifactsMissingError(f"{uri}: {name} is {member.size} bytes, above the {limit} read")
            extracted = archive.extractfile(member)
            if extracted is not None:
                found[name] = extracted.read()
    return found, response.get("VersionId")


# The model archive is held in memory up to this size, on the Lambda's disk beyond it.
SPOOL_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Sealed:
    """A piece of evidence written once: where it is, its SHA-256 (hex) and its VersionId."""

    uri: str
    sha256: str
    version_id: str | None


def seal(s3: S3Client, source_uri: str, source_version: str | None, bucket: str, key: str) -> Sealed:
    """Copy the archive evaluation judged (`source_version` of `source_uri`) to `key`, once.

    The bytes are hashed as they pass through this function; S3 is given the digest
    (`ChecksumSHA256`): it refuses a body that does not match and keeps the digest with the
    object, so anyone can compare it with the package's metadata without downloading. The bucket
    policy refuses any other writer, any write without If-None-Match and every delete under
    `models/packages/`: what was sealed stays what the package names.
    """
    source_bucket, source_key = split_s3_uri(source_uri)
    request: dict[str, Any] = {"Bucket": source_bucket, "Key": source_key}
    if source_version is not None:
        request["VersionId"] = source_version  # the bytes judged, even if a job overwrote the key since
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as copy:
        sha256 = _copy_hashing(s3.get_object(**request)["Body"], copy)
        copy.seek(0)
        return write_once(s3, bucket, key, copy, sha256=sha256, content_type="application/gzip")


def write_once(
    s3: S3Client, bucket: str, key: str, body: IO[bytes] | bytes, *, sha256: str, content_type: str
) -> Sealed:
    """Write `body` (whose SHA-256 is `sha256`) to `key` only if nothing is there (If-None-Match).

    A retry finds its own bytes there and goes on; other bytes there (a job overwrote the archive
    between two attempts) raise `EvidenceConflictError`: evidence is never replaced.
    """
    try:
        written = s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode(),
            ContentType=content_type,
            IfNoneMatch="*",
        )
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code")
        if code == "ConditionalRequestConflict":  # another write of the key is in flight: later
            raise AwsServiceBusyError(f"s3://{bucket}/{key} is being written by another request") from error
        if code != "PreconditionFailed":
            raise
        return _written_before(s3, bucket, key, sha256)
    return Sealed(f"s3://{bucket}/{key}", sha256, written.get("VersionId"))


def _copy_hashing(body: Any, into: IO[bytes] | None) -> str:
    """The SHA-256 (hex) of what `body` holds, written on to `into` as it is read."""
    digest = hashlib.sha256()
    while chunk := body.read(CHUNK_BYTES):
        digest.update(chunk)
        if into is not None:
            into.write(chunk)
    return digest.hexdigest()


def _written_before(s3: S3Client, bucket: str, key: str, sha256: str) -> Sealed:
    """What an earlier attempt wrote, if it holds these very bytes (hashed again: a rare retry's
    download, rather than trusting a digest the writer supplied)."""
    response = s3.get_object(Bucket=bucket, Key=key)
    found = _copy_hashing(response["Body"], None)
    if found != sha256:
        raise EvidenceConflictError(
            f"s3://{bucket}/{key} already holds other bytes (SHA-256 {found}, this evaluation's {sha256}): "
            "evidence is never replaced"
        )
    return Sealed(f"s3://{bucket}/{key}", sha256, response.get("VersionId"))
