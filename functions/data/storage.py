"""The data bucket: reads, copies, quarantine and reports, with every write confirmed."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

from botocore.exceptions import ClientError

from functions.common.errors import EncryptionRefusedError, ObjectGoneError, ObjectTooLargeError, RetrainError
from functions.data.models import ObjectVersion

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from mypy_boto3_s3 import S3Client

DELETE_CHUNK = 1000  # DeleteObjects takes at most 1,000 keys
# CopyObject refuses a source above 5 GiB; only a multipart upload whose parts are copied
# (UploadPartCopy) copies more. A part has 5 MiB to 5 GiB (the last may be smaller), 10,000 at most.
COPY_OBJECT_MAX_BYTES = 5 * 1024**3
MIN_PART_BYTES = 5 * 1024**2
MAX_PARTS = 10_000
# Parts of 512 MiB, 8 copied at once: a 5 GiB object is copied in about two rounds, well within
# the intake's timeout (each UploadPartCopy is copied by S3 itself, no byte passes through here).
COPY_PART_BYTES = 512 * 1024**2
COPY_PART_WORKERS = 8
# What CopyObject carries over from its source (MetadataDirective COPY) and a multipart upload
# must be told: the content headers and the user metadata.
_CARRIED_HEADERS = ("ContentType", "ContentEncoding", "ContentDisposition", "ContentLanguage", "CacheControl")
_PART_CHECKSUMS = ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumSHA1", "ChecksumSHA256", "ChecksumCRC64NVME")
# What a read of an object we may not decrypt answers: SSE-C without its key is 400 InvalidRequest
# (a HEAD, which has no body, plain 400); a KMS key our role may not use is 403 AccessDenied, or a
# `KMS.*` code when the key is disabled, pending deletion or gone. Each could also be a fault of
# our own (a role that lost s3:GetObjectVersion): the object's encryption, read with a HEAD (which
# needs no KMS permission), decides which.
_MAYBE_ENCRYPTION = frozenset({"AccessDenied", "InvalidRequest", "400", "403"})
SSE_KMS = "aws:kms"
SSE_C = "it is encrypted with a customer-provided key (SSE-C), which only its uploader has"


class _Part(NamedTuple):
    number: int  # from 1
    first: int  # the first and last byte of the source it copies
    last: int


class DeleteRefusedError(RetrainError):
    """S3 refused to delete some object versions (a DeleteObjects answer with Errors)."""


def encryption_problem(answer: Mapping[str, Any], data_key_arn: str | None) -> str | None:
    """Why an object's encryption (from its GetObject or HeadObject answer) is not the one the
    bucket accepts, SSE-KMS with the stack's key; None when it is. An answer without encryption
    headers comes only from an emulator with no default encryption (S3 encrypts every object)."""
    if answer.get("SSECustomerAlgorithm"):
        return SSE_C
    algorithm = answer.get("ServerSideEncryption")
    if algorithm is None:
        return None
    if algorithm != SSE_KMS:
        return f"it is encrypted with {algorithm}, not SSE-KMS with the stack's key"
    used = answer.get("SSEKMSKeyId")
    if data_key_arn and used != data_key_arn:
        return f"it is encrypted with the KMS key {used}, not the stack's key {data_key_arn}"
    return None


class DataBucket:
    def __init__(
        self,
        client: S3Client,
        bucket: str,
        *,
        multipart_threshold: int = COPY_OBJECT_MAX_BYTES,
        part_bytes: int = COPY_PART_BYTES,
        data_key_arn: str | None = None,
    ) -> None:
        """`multipart_threshold`: objects above it are copied in parts (at most CopyObject's
        limit; tests lower it to copy small objects in parts). `data_key_arn`: the stack's KMS key;
        an object encrypted otherwise is refused (`EncryptionRefusedError`) by `read` and `copy`
        (None: any SSE-KMS key is accepted, for buckets without the stack's key)."""
        if not 1 <= multipart_threshold <= COPY_OBJECT_MAX_BYTES:
            raise ValueError(f"the multipart threshold must be 1 to {COPY_OBJECT_MAX_BYTES} bytes")
        if not MIN_PART_BYTES <= part_bytes <= COPY_OBJECT_MAX_BYTES:
            raise ValueError(f"a copied part has {MIN_PART_BYTES} to {COPY_OBJECT_MAX_BYTES} bytes")
        self._s3 = client
        self.name = bucket
        self._multipart_threshold = multipart_threshold
        self._part_bytes = part_bytes
        self._data_key_arn = data_key_arn

    def read(self, key: str, version: str | None, limit: int) -> tuple[bytes, str | None]:
        """At most `limit + 1` bytes of one version (enough for validation to say 'too large').

        An object encrypted otherwise than the bucket accepts raises `EncryptionRefusedError`,
        whether S3 refused to decrypt it for us or not (SSE-S3, or a key our role may use).
        """
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
            self._raise_if_gone(error, key, version)
            if code in _MAYBE_ENCRYPTION or str(code).startswith("KMS."):
                # Raises EncryptionRefusedError if that is why; else S3's own answer stands.
                with contextlib.suppress(ClientError):
                    self._head(key, version)
            raise
        body = response["Body"]
        problem = encryption_problem(response, self._data_key_arn)
        if problem is not None:
            body.close()  # unread: its connection goes back to the pool
            raise EncryptionRefusedError(key, problem)
        return body.read(), response.get("VersionId")

    def _raise_if_gone(self, error: ClientError, key: str, version: str | None) -> None:
        """`ObjectGoneError` if S3 answered that the key or version does not exist (HeadObject
        can only say 404: a HEAD response has no body to name the error)."""
        if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "NoSuchVersion", "404"}:
            where = f"s3://{self.name}/{key}" + (f" version {version}" if version else "")
            raise ObjectGoneError(f"{where} is gone") from error

    def _head(self, key: str, version: str | None) -> Any:
        """The object's HeadObject answer, its encryption checked (`EncryptionRefusedError`)."""
        request: dict[str, str] = {"Bucket": self.name, "Key": key}
        if version:
            request["VersionId"] = version
        try:
            head = self._s3.head_object(**request)  # type: ignore[arg-type]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"400", "InvalidRequest"}:
                # HeadObject of an SSE-C object without its key: S3's only answer is 400.
                raise EncryptionRefusedError(key, SSE_C) from error
            raise
        problem = encryption_problem(head, self._data_key_arn)
        if problem is not None:
            raise EncryptionRefusedError(key, problem)
        return head

    def current_version(self, key: str) -> str | None:
        """The VersionId of the key's current version; None if it is gone or unversioned."""
        try:
            version = self._s3.head_object(Bucket=self.name, Key=key).get("VersionId")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey"}:
                return None
            raise
        return version

    def copy(self, key: str, version: str | None, destination: str, *, max_bytes: int | None = None) -> str | None:
        """Copy one version; the returned VersionId is the confirmation we record.

        Its size decides how: CopyObject up to the multipart threshold, a multipart copy above it
        (CopyObject fails above 5 GiB). Before any copy: an object above `max_bytes` raises
        `ObjectTooLargeError`, one encrypted otherwise than the bucket accepts
        `EncryptionRefusedError` (S3 would refuse to copy it for us, or we may not).
        """
        source: dict[str, str] = {"Bucket": self.name, "Key": key}
        if version:
            source["VersionId"] = version
        try:
            head = self._head(key, version)
            if max_bytes is not None and head["ContentLength"] > max_bytes:
                raise ObjectTooLargeError(key, head["ContentLength"], max_bytes)
            if head["ContentLength"] > self._multipart_threshold:
                return self._copy_in_parts(source, destination, head)
            response = self._s3.copy_object(
                Bucket=self.name,
                Key=destination,
                CopySource=source,  # type: ignore[arg-type]
            )
        except ClientError as error:
            # Removed since it was read: by another invocation that moved it (a newer upload
            # superseded it, or a concurrent judgement copied it first), or by an erasure.
            self._raise_if_gone(error, key, version)
            raise
        return response.get("VersionId")

    def _copy_in_parts(self, source: dict[str, str], destination: str, head: Any) -> str | None:
        """Copy `source` (pinned by its VersionId) with UploadPartCopy; the new VersionId.

        Done here rather than with boto3's managed `copy`, which returns no VersionId: reading the
        destination's afterwards could name another version written meanwhile. Every call goes
        through the same client, so throttling is retried as for CopyObject (botocore's standard
        mode). A failed copy is aborted, so no parts are left to pay for.
        """
        size = int(head["ContentLength"])
        carried = {name: head[name] for name in _CARRIED_HEADERS if head.get(name)}
        upload = self._s3.create_multipart_upload(
            Bucket=self.name, Key=destination, Metadata=head.get("Metadata", {}), **carried
        )
        upload_id = upload["UploadId"]
        part = max(self._part_bytes, -(-size // MAX_PARTS))  # 10,000 parts at most
        starts = range(0, size, part)
        ranges = [_Part(number, start, min(start + part, size) - 1) for number, start in enumerate(starts, 1)]
        try:
            with ThreadPoolExecutor(max_workers=COPY_PART_WORKERS) as pool:
                parts = list(pool.map(lambda r: self._copy_part(source, destination, upload_id, r), ranges))
            response = self._s3.complete_multipart_upload(
                Bucket=self.name,
                Key=destination,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )
        except Exception:
            self._abort(destination, upload_id)
            raise
        return response.get("VersionId")

    def _copy_part(self, source: dict[str, str], destination: str, upload_id: str, part: _Part) -> dict[str, Any]:
        response = self._s3.upload_part_copy(
            Bucket=self.name,
            Key=destination,
            UploadId=upload_id,
            PartNumber=part.number,
            CopySource=source,  # type: ignore[arg-type]
            CopySourceRange=f"bytes={part.first}-{part.last}",
        )
        result: dict[str, Any] = dict(response["CopyPartResult"])
        # Completing an upload made with a checksum algorithm needs each part's checksum.
        return {
            "PartNumber": part.number,
            "ETag": result["ETag"],
            **{name: result[name] for name in _PART_CHECKSUMS if result.get(name)},
        }

    def _abort(self, destination: str, upload_id: str) -> None:
        # The copy's own error is the one to report; a lifecycle rule that aborts incomplete
        # uploads removes what an abort refused here leaves behind.
        with contextlib.suppress(ClientError):
            self._s3.abort_multipart_upload(Bucket=self.name, Key=destination, UploadId=upload_id)

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
        return self.put_bytes(key, text.encode(), content_type)

    def put_bytes(self, key: str, body: bytes, content_type: str) -> str | None:
        """Write `body`; the VersionId written."""
        response = self._s3.put_object(Bucket=self.name, Key=key, Body=body, ContentType=content_type)
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
