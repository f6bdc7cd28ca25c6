"""An annotator's upload encrypted otherwise than with the stack's key (SSE-C, SSE-S3, another KMS
key): the bucket policy refuses those on AWS; one that still arrives is refused where it lies, with
a reason that says what to do, and never fails into the dead-letter queue.

As logic, on an emulated ledger and a bucket whose default encryption is the stack's key. moto
stores SSE-C objects like any other and never refuses a KMS key, so what S3 answers a reader
without the key (a 400, a 403) is answered from botocore's hooks: reads only, so nothing moto does
behind them changes anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.data.models import FileStatus, PairStatus
from tests.integration.data_drops import scene
from tests.unit.intake_harness import Harness, emulated_intake

IMAGE, LABEL = "incoming/b/images/x.jpg", "incoming/b/labels/x.png"


@pytest.fixture
def at() -> Iterator[Harness]:
    with emulated_intake(encrypted=True) as harness:
        yield harness


def _reason(at: Harness, landing: str) -> dict[str, Any]:
    quarantined = prefixes.quarantine_key("b", prefixes.relative_to_batch(landing))
    return json.loads(at.body(prefixes.reason_key(quarantined)))  # type: ignore[no-any-return]


def _fate(at: Harness, key: str, version: str | None) -> FileStatus:
    record = at.intake.ledger.file("b", key, version or "")
    assert record is not None, f"{key} has no ledger record"
    return record.status


def _refused_by_s3(at: Harness, key: str, operation: str, code: str, message: str, status: int) -> None:
    """S3 answers `operation` on `key` with this error, as it does a reader without the key."""

    def refuse(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key") == key:
            error = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
            raise ClientError(error, operation)  # type: ignore[arg-type]

    at.s3.meta.events.register(f"before-parameter-build.s3.{operation}", refuse)


def _another_key() -> str:
    return boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["Arn"]


def _assert_refused_where_it_lies(at: Harness, key: str, version: str | None, says: str) -> None:
    assert _fate(at, key, version) is FileStatus.REFUSED
    assert (key, version) in at.versions("incoming/"), "left in incoming/, untouched"
    quarantined = prefixes.quarantine_key("b", prefixes.relative_to_batch(key))
    assert quarantined not in {k for k, _ in at.versions("quarantine/")}, "no copy was made"
    reason = _reason(at, key)
    assert reason["status"] == "refused"
    (why,) = reason["reasons"]
    assert why["code"] == "encryption_not_accepted"
    assert says in why["message"]
    assert "upload it again without encryption headers" in why["message"]


def test_an_upload_under_another_kms_key_is_refused_with_the_key_named(at: Harness) -> None:
    other = _another_key()
    event = at.upload(IMAGE, scene(1).image, ServerSideEncryption="aws:kms", SSEKMSKeyId=other)

    assert at.intake.process(event) is FileStatus.REFUSED

    _assert_refused_where_it_lies(at, IMAGE, event.version_id, f"KMS key {other}, not the stack's key")


def test_an_upload_under_s3_managed_keys_is_refused(at: Harness) -> None:
    event = at.upload(IMAGE, scene(1).image, ServerSideEncryption="AES256")

    assert at.intake.process(event) is FileStatus.REFUSED

    _assert_refused_where_it_lies(at, IMAGE, event.version_id, "encrypted with AES256")


def test_an_sse_c_upload_s3_will_not_show_us_is_refused(at: Harness) -> None:
    event = at.upload(IMAGE, scene(1).image)
    # S3's answers to a reader without the customer's key: GetObject 400 InvalidRequest, and
    # HeadObject a bare 400 (a HEAD has no body to name the error).
    sse_c = "The object was stored using a form of Server Side Encryption. The correct parameters must be provided"
    _refused_by_s3(at, IMAGE, "GetObject", "InvalidRequest", sse_c, 400)
    _refused_by_s3(at, IMAGE, "HeadObject", "400", "Bad Request", 400)

    assert at.intake.process(event) is FileStatus.REFUSED

    _assert_refused_where_it_lies(at, IMAGE, event.version_id, "customer-provided key (SSE-C)")


def test_an_upload_under_a_key_our_role_may_not_use_is_refused_not_retried(at: Harness) -> None:
    # On AWS S3 refuses to decrypt for us (403); its encryption, from a HEAD, says why.
    other = _another_key()
    event = at.upload(IMAGE, scene(1).image, ServerSideEncryption="aws:kms", SSEKMSKeyId=other)
    denied = "User is not authorized to perform: kms:Decrypt on the resource associated with this ciphertext"
    _refused_by_s3(at, IMAGE, "GetObject", "AccessDenied", denied, 403)

    assert at.intake.process(event) is FileStatus.REFUSED

    _assert_refused_where_it_lies(at, IMAGE, event.version_id, f"KMS key {other}")


def test_access_denied_on_an_upload_under_the_stacks_key_is_our_fault_and_fails_loudly(at: Harness) -> None:
    # A role that lost its read permission must not refuse every upload as "wrongly encrypted":
    # the message fails, is retried, and lands in the DLQ, where its alarm is seen.
    event = at.upload(IMAGE, scene(1).image)
    _refused_by_s3(at, IMAGE, "GetObject", "AccessDenied", "Access Denied", 403)

    with pytest.raises(ClientError, match="AccessDenied"):
        at.intake.process(event)

    assert at.intake.ledger.file("b", IMAGE, event.version_id or "") is None
    assert (IMAGE, event.version_id) in at.versions("incoming/")


def test_a_stray_file_under_another_key_is_refused_instead_of_copied(at: Harness) -> None:
    # Files outside images/ and labels/ are set aside unread: the copy is what S3 would refuse.
    event = at.upload("incoming/b/notes.txt", b"hello", ServerSideEncryption="aws:kms", SSEKMSKeyId=_another_key())

    assert at.intake.process(event) is FileStatus.REFUSED

    codes = [r["code"] for r in _reason(at, "incoming/b/notes.txt")["reasons"]]
    assert codes == ["unexpected_file", "encryption_not_accepted"], "why it is rejected, and why it was left"
    assert ("incoming/b/notes.txt", event.version_id) in at.versions("incoming/")


def test_the_partner_of_a_refused_image_learns_why_and_nothing_waits(at: Harness) -> None:
    label = at.upload(LABEL, scene(1).label)
    at.intake.process(label)  # pending: waiting for its image
    image = at.upload(IMAGE, scene(1).image, ServerSideEncryption="aws:kms", SSEKMSKeyId=_another_key())

    assert at.intake.process(image) is FileStatus.REFUSED

    assert _fate(at, LABEL, label.version_id) is FileStatus.QUARANTINED
    (why,) = _reason(at, LABEL)["reasons"]
    assert why["code"] == "encryption_not_accepted"
    pair, _ = at.intake.ledger.pair("b", "x") or pytest.fail("no pair")
    assert pair.status is PairStatus.INVALID, "settled: the sweeper waits for no partner"
    assert at.versions("dataset/") == []


def test_an_image_uploaded_again_without_headers_replaces_the_refused_one_and_is_curated(at: Harness) -> None:
    refused = at.upload(IMAGE, scene(1).image, ServerSideEncryption="AES256")
    at.intake.process(refused)
    label = at.upload(LABEL, scene(1).label)
    at.intake.process(label)  # quarantined with its refused partner
    again = at.upload(IMAGE, scene(1).image)

    assert at.intake.process(again) is FileStatus.CURATED

    assert _fate(at, IMAGE, refused.version_id) is FileStatus.SUPERSEDED
    assert at.versions("incoming/") == [], "the refused version went with its replacement"
    assert {key for key, _ in at.versions("dataset/")} == {"dataset/images/b/x.jpg", "dataset/labels/b/x.png"}
