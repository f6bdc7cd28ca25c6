"""The intake on hostile keys and huge objects: an unsafe batch folder, a key too long for what is
derived from it, and an object above what CopyObject copies. Each is set aside, never lost; an
object too large to move within the function's time is refused where it lies.

As logic, on an emulated ledger and bucket (moto checks S3's and DynamoDB's key limits).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest

from functions.common import prefixes
from functions.common.prefixes import MAX_INCOMING_KEY_BYTES
from functions.data.models import FileStatus
from functions.data.storage import MIN_PART_BYTES, DataBucket
from functions.validation import ReasonCode, ValidationConfig
from tests.integration.data_drops import scene
from tests.unit.intake_harness import BUCKET, Harness, emulated_intake


@pytest.fixture
def at() -> Iterator[Harness]:
    with emulated_intake() as harness:
        yield harness


def _reason(at: Harness, quarantined: str) -> dict[str, Any]:
    return json.loads(at.body(prefixes.reason_key(quarantined)))  # type: ignore[no-any-return]


def _deep_key(start: str, length: int) -> str:
    key = start + "d/" * ((length - len(start) - 1) // 2)  # then at least one "x": no trailing /
    return key + "x" * (length - len(key))


@pytest.mark.parametrize(
    "batch",
    ["..", ".", "a\x01b", "back\\slash", "\u202egpj", "b" * 300],
    ids=["dotdot", "dot", "control", "backslash", "bidi", "long"],
)
def test_an_upload_under_an_unsafe_batch_folder_is_quarantined_under_a_safe_key(at: Harness, batch: str) -> None:
    key = f"incoming/{batch}/images/a.jpg"
    event = at.upload(key, scene(1).image)

    assert at.intake.process(event) is FileStatus.QUARANTINED

    quarantined = prefixes.unsafe_quarantine_key(key)
    assert at.body(quarantined) == scene(1).image, "nothing lost: its bytes are in quarantine"
    reason = _reason(at, quarantined)
    assert reason["key"] == key
    assert [r["code"] for r in reason["reasons"]] == ["unsafe_name"]
    assert "batch folder" in reason["reasons"][0]["message"]
    assert at.versions("incoming/") == [], "its landing version went, by VersionId"
    assert at.versions("dataset/") == []
    record = at.intake.ledger.file(prefixes.UNSAFE, key, event.version_id or "")
    assert record is not None and record.status is FileStatus.QUARANTINED
    assert (record.destination, record.destination_version) == (quarantined, at.versions(quarantined)[0][1])
    assert at.intake.ledger.batch(batch) is None, "an unsafe folder is no ledger partition"


def test_an_unsafe_file_name_is_not_reused_as_its_quarantine_key(at: Harness) -> None:
    key = "incoming/b/images/../../../etc/a.jpg"
    event = at.upload(key, scene(1).image)

    assert at.intake.process(event) is FileStatus.QUARANTINED

    quarantined = prefixes.unsafe_quarantine_key(key)
    assert at.body(quarantined) == scene(1).image
    assert [k for k, _ in at.versions("quarantine/")] == [quarantined, prefixes.reason_key(quarantined)]
    record = at.intake.ledger.file("b", key, event.version_id or "")
    assert record is not None and record.reasons[0].code is ReasonCode.UNSAFE_NAME


@pytest.mark.parametrize("length", [MAX_INCOMING_KEY_BYTES + 1, 1024], ids=["one over the cap", "S3's longest"])
def test_a_key_over_the_cap_is_quarantined_with_the_limit_and_its_record_kept(at: Harness, length: int) -> None:
    key = _deep_key("incoming/b/", length)
    event = at.upload(key, b"anything")

    assert at.intake.process(event) is FileStatus.QUARANTINED

    quarantined = prefixes.unsafe_quarantine_key(key)
    assert at.body(quarantined) == b"anything"
    (reason,) = _reason(at, quarantined)["reasons"]
    assert reason["code"] == "unsafe_name"
    assert f"limit of {MAX_INCOMING_KEY_BYTES}" in reason["message"]
    record = at.intake.ledger.file("b", key, event.version_id or "")
    assert record is not None and record.key == key, "the ledger keeps the whole key"
    assert [f.key for f in at.intake.ledger.files("b")] == [key]


def test_a_key_at_the_cap_is_judged_under_its_own_name(at: Harness) -> None:
    key = _deep_key("incoming/b/", MAX_INCOMING_KEY_BYTES)
    event = at.upload(key, b"anything")

    assert at.intake.process(event) is FileStatus.QUARANTINED

    quarantined = prefixes.quarantine_key("b", prefixes.relative_to_batch(key))
    assert at.body(quarantined) == b"anything"
    assert _reason(at, quarantined)["reasons"][0]["code"] == "unexpected_file"


def test_the_longest_pair_a_batch_can_hold_is_curated(at: Harness) -> None:
    # Every segment at its 255-byte limit: the longest keys classify_key accepts.
    batch, stem = "b" * 255, "s" * 251
    image = at.upload(f"incoming/{batch}/images/{stem}.jpg", scene(1).image)
    label = at.upload(f"incoming/{batch}/labels/{stem}.png", scene(1).label)

    at.intake.process(image)

    assert at.intake.process(label) is FileStatus.CURATED
    assert at.body(f"dataset/images/{batch}/{stem}.jpg") == scene(1).image


# ----------------------------------------------------------- multipart --
def _count_calls(at: Harness) -> dict[str, int]:
    calls = {"CopyObject": 0, "UploadPartCopy": 0}

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    for operation in calls:
        at.s3.meta.events.register(f"before-call.s3.{operation}", count)
    return calls


def test_a_pair_above_the_threshold_is_curated_by_a_multipart_copy_of_its_versions() -> None:
    with emulated_intake(multipart_threshold=64) as at:
        calls = _count_calls(at)
        at.s3.put_object(
            Bucket=BUCKET, Key="incoming/b/images/x.jpg", Body=b"old", ContentType="image/jpeg"
        )  # an older version: the copy must take the one the event names
        image = at.upload("incoming/b/images/x.jpg", scene(1).image)
        at.s3.put_object(
            Bucket=BUCKET,
            Key="incoming/b/labels/x.png",
            Body=scene(1).label,
            ContentType="image/png",
            Metadata={"annotator": "ada"},
        )
        label = at.upload("incoming/b/labels/x.png", scene(1).label)  # the current version, no metadata
        at.intake.process(image)

        assert at.intake.process(label) is FileStatus.CURATED

        assert calls == {"CopyObject": 0, "UploadPartCopy": 2}
        pair, _ = at.intake.ledger.pair("b", "x") or pytest.fail("no pair")
        for key, body, version in (
            ("dataset/images/b/x.jpg", scene(1).image, pair.image_destination_version),
            ("dataset/labels/b/x.png", scene(1).label, pair.label_destination_version),
        ):
            assert at.versions(key) == [(key, version)], "the version recorded is the one the copy made"
            assert at.body(key) == body


def test_a_multipart_copy_carries_the_content_type_and_metadata_like_copy_object(at: Harness) -> None:
    at.s3.put_object(Bucket=BUCKET, Key="src", Body=b"x" * 100, ContentType="image/png", Metadata={"team": "b"})
    bucket = DataBucket(at.s3, BUCKET, multipart_threshold=10)

    bucket.copy("src", at.s3.head_object(Bucket=BUCKET, Key="src")["VersionId"], "dst")

    head = at.s3.head_object(Bucket=BUCKET, Key="dst")
    assert (head["ContentType"], head["Metadata"]) == ("image/png", {"team": "b"})


def test_a_large_object_is_copied_in_parts_of_the_chosen_size(at: Harness) -> None:
    body = bytes(range(256)) * (MIN_PART_BYTES // 256 * 2 + 7)  # two full parts and a short one
    old = at.s3.put_object(Bucket=BUCKET, Key="src", Body=body)["VersionId"]
    at.s3.put_object(Bucket=BUCKET, Key="src", Body=b"newer")
    bucket = DataBucket(at.s3, BUCKET, multipart_threshold=MIN_PART_BYTES, part_bytes=MIN_PART_BYTES)
    calls = _count_calls(at)

    version = bucket.copy("src", old, "dst")

    assert calls["UploadPartCopy"] == 3
    assert at.s3.get_object(Bucket=BUCKET, Key="dst", VersionId=version or "")["Body"].read() == body


def test_a_failed_multipart_copy_is_aborted(at: Harness) -> None:
    at.s3.put_object(Bucket=BUCKET, Key="src", Body=b"x" * 100)
    version = at.s3.head_object(Bucket=BUCKET, Key="src")["VersionId"]

    class PartFails(DataBucket):
        def _copy_part(self, *args: Any) -> dict[str, Any]:
            raise RuntimeError("S3 went away")

    with pytest.raises(RuntimeError):
        PartFails(at.s3, BUCKET, multipart_threshold=10).copy("src", version, "dst")

    assert at.s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def _moves(at: Harness) -> dict[str, int]:
    """Counts of every call that would copy or start copying an object."""
    calls = {"CopyObject": 0, "UploadPartCopy": 0, "CreateMultipartUpload": 0}

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    for operation in calls:
        at.s3.meta.events.register(f"before-call.s3.{operation}", count)
    return calls


def test_an_object_over_the_size_limit_is_refused_where_it_lies_and_never_copied() -> None:
    # Copying up to 5 TB in parts inside a 60 s function ends in the DLQ; the upload stays, refused.
    config = ValidationConfig(max_file_bytes=1000)
    with emulated_intake(config=config, multipart_threshold=1000) as at:
        moves = _moves(at)
        huge = scene(1).image + b"\0" * 5000
        event = at.upload("incoming/b/images/x.jpg", huge)

        assert at.intake.process(event) is FileStatus.REFUSED

        assert moves == {"CopyObject": 0, "UploadPartCopy": 0, "CreateMultipartUpload": 0}
        assert at.versions("incoming/") == [("incoming/b/images/x.jpg", event.version_id)], "left where it lies"
        assert at.versions("quarantine/") == [("quarantine/b/images/x.jpg.reason.json", ANY)], "only its reason"
        reason = _reason(at, "quarantine/b/images/x.jpg")
        assert reason["status"] == "refused"
        (why,) = reason["reasons"]
        assert why["code"] == "file_too_large"
        assert f"{len(huge)} bytes, over the limit of 1000" in why["message"]
        assert "left in incoming/" in why["message"] and "delete it" in why["message"]
        record = at.intake.ledger.file("b", event.key, event.version_id or "")
        assert record is not None and record.status is FileStatus.REFUSED
        assert record.reason_key == "quarantine/b/images/x.jpg.reason.json"


def test_a_stray_file_s3_says_holds_5_tb_is_refused_without_a_single_copy(at: Harness) -> None:
    # A file outside images/ and labels/ is set aside unread; S3 can hold 5 TB under any name.
    event = at.upload("incoming/b/drive/recording.mp4", b"moto cannot hold 5 TB")

    def five_terabytes(parsed: dict[str, Any], **_: Any) -> None:
        parsed["ContentLength"] = 5 * 1024**4

    at.s3.meta.events.register("after-call.s3.HeadObject", five_terabytes)
    moves = _moves(at)

    assert at.intake.process(event) is FileStatus.REFUSED

    assert moves == {"CopyObject": 0, "UploadPartCopy": 0, "CreateMultipartUpload": 0}
    assert at.versions("incoming/") == [(event.key, event.version_id)]
    codes = [r["code"] for r in _reason(at, "quarantine/b/drive/recording.mp4")["reasons"]]
    assert codes == ["unexpected_file", "file_too_large"], "why it is rejected, and why it was left"
