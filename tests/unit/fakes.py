"""Small in-memory stand-ins for the AWS clients a function's logic is given, for fast unit tests.

Where a test needs one or two calls it stubs a real boto3 client (`stubbed`: botocore's Stubber,
which checks every request against the service's model, and fails on a call it was not told
about). Where the logic reads back what it wrote, or writes many objects, a fake keeps them:
`FakeS3` is a versioned bucket in a dict, `FakeSNS` an outbox. Neither opens a socket.
"""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

REGION = "us-east-1"


@contextmanager
def stubbed(service: str) -> Iterator[tuple[Any, Stubber]]:
    """A real client for `service` that answers only what the test queued on its Stubber, and
    must have been asked everything queued by the end."""
    client = boto3.client(service, region_name=REGION)  # type: ignore[call-overload]
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


@contextmanager
def versioned_bucket(bucket: str) -> Iterator[Any]:
    """An S3 client (moto, in process) with `bucket` created and versioning on, as the stack's
    data bucket is: for logic that reads object versions or writes conditionally."""
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=bucket)
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        yield client


def body(data: bytes) -> StreamingBody:
    """What a GetObject answer's Body is."""
    return StreamingBody(io.BytesIO(data), len(data))


def tar_gz(members: dict[str, bytes]) -> bytes:
    """A `model.tar.gz` or `output.tar.gz` holding `members`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def no_such_key(operation: str = "GetObject") -> ClientError:
    return ClientError({"Error": {"Code": "NoSuchKey", "Message": "The specified key does not exist."}}, operation)


@dataclass
class FakeS3:
    """A versioned S3 in a dict: what was put can be read back, by key or by VersionId."""

    objects: dict[tuple[str, str], list[tuple[str, bytes, str | None]]] = field(default_factory=dict)
    _versions: Iterator[int] = field(default_factory=itertools.count)

    # Called with boto3's keyword arguments (Bucket, Key, Body, ...), as the logic calls the client.
    def put_object(self, **request: Any) -> dict[str, Any]:
        if request.get("IfNoneMatch") == "*" and self.objects.get((request["Bucket"], request["Key"])):
            raise ClientError(
                {
                    "Error": {
                        "Code": "PreconditionFailed",
                        "Message": "At least one of the pre-conditions you specified did not hold",
                    }
                },
                "PutObject",
            )
        version = f"v{next(self._versions)}"
        data = request["Body"]
        data = data.encode() if isinstance(data, str) else data.read() if hasattr(data, "read") else data
        self.objects.setdefault((request["Bucket"], request["Key"]), []).append(
            (version, data, request.get("ContentType"))
        )
        return {"VersionId": version}

    def get_object(self, **request: Any) -> dict[str, Any]:
        versions = self.objects.get((request["Bucket"], request["Key"]))
        if not versions:
            raise no_such_key()
        wanted = request.get("VersionId")
        version, data, content_type = next(v for v in reversed(versions) if wanted in (None, v[0]))
        return {"Body": body(data), "VersionId": version, "ContentType": content_type or ""}

    def read(self, bucket: str, key: str) -> bytes:
        return bytes(self.get_object(Bucket=bucket, Key=key)["Body"].read())

    def json(self, bucket: str, key: str) -> Any:
        return json.loads(self.read(bucket, key))

    def keys(self, bucket: str) -> list[str]:
        return sorted(key for (name, key) in self.objects if name == bucket)

    def list_objects_v2(self, **request: Any) -> dict[str, Any]:
        """One page holding every key under the prefix (no continuation)."""
        found = [key for key in self.keys(request["Bucket"]) if key.startswith(request.get("Prefix", ""))]
        return {"Contents": [{"Key": key} for key in found], "IsTruncated": False}


@dataclass
class FakeSNS:
    """An SNS topic's outbox."""

    published: list[dict[str, Any]] = field(default_factory=list)

    def publish(self, **message: Any) -> dict[str, Any]:
        self.published.append(message)
        return {"MessageId": f"m-{len(self.published)}"}
