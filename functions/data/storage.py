"""The data bucket: reads, copies, quarantine and reports, with every write confirmed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from functions.common.errors import ObjectGoneError, RetrainError
from functions.data.models import ObjectVersion

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from mypy_boto3_s3 import S3Client

DELETE_CHUNK = 1000  # DeleteObjects takes at most 1,000 keys


class DeleteRefusedError(RetrainError):
    """S3 refused to delete some object versions (a DeleteObjects answer with Errors)."""


class DataBucket:
    def __init__(self, client: S3Client, bucket: str) -> None:
        self._s3 = client
        self.name = bucket

    def read(self, key: str, version: str | None, limit: int) -> tuple[bytes, str | None]:
        """At most `limit + 1` bytes of one version (enough for validation to say 'too large')."""
        request: dict[str, Any] = {"Bucket": self.name, "Key": key, "Range": f"bytes=0-{limit}"}
        if version:
            request["VersionId"] = version
        try:
            response = self._s3.get_object(**request)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code == "InvalidRange":
                # S3 answers a ranged read of a zero-byte object with 416: it is empty, and
                # validation says so (`empty_file`); a retry would fail the same way forever.
                return b"", version
            # NoSuchVersion: that version was deleted (an erasure, or the uploader withdrew it).
            if code in {"NoSuchKey", "NoSuchVersion", "404"}:
                where = f"s3://{self.name}/{key}" + (f" version {version}" if version else "")
                raise ObjectGoneError(f"{where} is gone") from error
            raise
        return response["Body"].read(), response.get("VersionId")

    def current_version(self, key: str) -> str | None:
        """The VersionId of the key's current version; None if it is gone or unversioned."""
        try:
            version = self._s3.head_object(Bucket=self.name, Key=key).get("VersionId")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey"}:
                return None
            raise
        return version

    def copy(self, key: str, version: str | None, destination: str) -> str | None:
        """Copy one version; the returned VersionId is the confirmation we record."""
        source: dict[str, str] = {"Bucket": self.name, "Key": key}
        if version:
            source["VersionId"] = version
        response = self._s3.copy_object(
            Bucket=self.name,
            Key=destination,
            CopySource=source,  # type: ignore[arg-type]
        )
        return response.get("VersionId")

    def remove(self, key: str, version: str | None) -> None:
        """Remove one version from the landing zone, once its copy is confirmed.

        By VersionId, never by key: a key-level delete puts a delete marker over the key's
        *latest* version, which after a quick re-upload is a newer version nobody has copied yet
        (it would be hidden from the landing zone, and a lookup of the key's current version would
        find nothing). Deleting the version itself touches no other version. An unversioned
        bucket ("null") has one object per key: that is what is deleted.
        """
        if version and version != "null":
            self._s3.delete_object(Bucket=self.name, Key=key, VersionId=version)
        else:
            self._s3.delete_object(Bucket=self.name, Key=key)

    def put_json(self, key: str, document: Any) -> None:
        body = json.dumps(document, indent=2, ensure_ascii=False, default=str)
        self._s3.put_object(Bucket=self.name, Key=key, Body=body.encode(), ContentType="application/json")

    def put_text(self, key: str, text: str, content_type: str) -> str | None:
        """Write `text`; the VersionId written."""
        response = self._s3.put_object(Bucket=self.name, Key=key, Body=text.encode(), ContentType=content_type)
        return response.get("VersionId")

    def get_json(self, key: str) -> Any:
        """The JSON document at `key`; None when there is none."""
        try:
            body = self._s3.get_object(Bucket=self.name, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise
        return json.loads(body)

    def lines(self, key: str, version: str) -> Iterator[str]:
        """The text lines of one version of `key`."""
        body = self._s3.get_object(Bucket=self.name, Key=key, VersionId=version)["Body"]
        for raw in body.iter_lines():
            yield raw.decode("utf-8")

    def versions(self, prefix: str) -> list[ObjectVersion]:
        """Every version and delete marker under `prefix`."""
        found: list[ObjectVersion] = []
        pages = self._s3.get_paginator("list_object_versions").paginate(Bucket=self.name, Prefix=prefix)
        for page in pages:
            for kind, marker in (("Versions", False), ("DeleteMarkers", True)):
                found += [
                    ObjectVersion(
                        key=item["Key"],
                        version_id=item.get("VersionId") or "null",
                        delete_marker=marker,
                        latest=bool(item.get("IsLatest")),
                    )
                    for item in page.get(kind, [])  # type: ignore[attr-defined]
                ]
        return found

    def delete_versions(self, versions: Iterable[ObjectVersion]) -> None:
        """Delete these versions for good (DeleteObjects, 1,000 at a time)."""
        pending = [{"Key": v.key, "VersionId": v.version_id} for v in versions]
        for start in range(0, len(pending), DELETE_CHUNK):
            response = self._s3.delete_objects(
                Bucket=self.name,
                Delete={"Objects": pending[start : start + DELETE_CHUNK], "Quiet": True},  # type: ignore[typeddict-item]
            )
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise DeleteRefusedError(
                    f"S3 refused to delete {len(errors)} object versions, such as "
                    f"{first.get('Key')} ({first.get('VersionId')}): {first.get('Code')} "
                    f"{first.get('Message')}"
                )
