"""Reading a finished job's archives straight from S3, member by member.

`output.tar.gz` grows with the job (the profiler's files of every host): it is streamed and only
the members evaluation needs are kept, each up to a size limit, so a day-long job's archive never
has to fit in a Lambda's memory or disk.
"""

from __future__ import annotations

import tarfile
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.common.errors import RunArtifactsMissingError
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
) -> tuple[dict[str, bytes], str | None]:
    """The `wanted` members (names relative to the archive root) and the archive's VersionId.

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
            if name not in wanted or not member.isfile():
                continue
            if member.size > limit:
                raise RunArtifactsMissingError(f"{uri}: {name} is {member.size} bytes, above the {limit} read")
            extracted = archive.extractfile(member)
            if extracted is not None:
                found[name] = extracted.read()
    return found, response.get("VersionId")
