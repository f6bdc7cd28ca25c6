"""An annotation team's drop: every file checked, paired, curated or quarantined, accounted for."""

from __future__ import annotations

import json
import time
from urllib.parse import quote_plus

import pytest

from functions.common import prefixes
from functions.common.prefixes import MAX_INCOMING_KEY_BYTES
from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    audit,
    bad_label,
    delete_markers,
    drain,
    fates,
    landing_versions,
    scene,
    status_by_key,
    upload,
    upload_pair,
)
from tests.integration.helpers import queue_depth


def objects(stack: OfflineStack, prefix: str) -> list[str]:
    listed = stack.aws.s3.list_objects_v2(Bucket=stack.ref("DataBucket"), Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def read_json(stack: OfflineStack, key: str) -> dict[str, object]:
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()
    return json.loads(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("label_first", [False, True], ids=["image first", "label first"])
def test_a_valid_pair_is_curated_under_its_real_name_whichever_file_comes_first(
    data_stack: OfflineStack, label_first: bool
) -> None:
    upload_pair(data_stack, "munich-11", "café corner 1+2", scene(1), label_first=label_first)

    drain(data_stack)

    assert objects(data_stack, "dataset/") == [
        "dataset/images/munich-11/café corner 1+2.jpg",
        "dataset/labels/munich-11/café corner 1+2.png",
    ]
    assert objects(data_stack, "incoming/") == [], "the landing zone keeps nothing it curated"
    assert set(status_by_key(data_stack).values()) == {"curated"}
    assert_every_upload_accounted_for_once(data_stack)


def test_a_mask_with_unknown_classes_sends_both_files_to_quarantine_with_the_reason(
    data_stack: OfflineStack,
) -> None:
    upload_pair(data_stack, "b1", "street", scene(2)._replace_label(bad_label([0, 33, 250])))

    drain(data_stack)

    assert objects(data_stack, "dataset/") == []
    assert objects(data_stack, "quarantine/") == [
        "quarantine/b1/images/street.jpg",
        "quarantine/b1/images/street.jpg.reason.json",
        "quarantine/b1/labels/street.png",
        "quarantine/b1/labels/street.png.reason.json",
    ]
    reason = read_json(data_stack, "quarantine/b1/labels/street.png.reason.json")
    (problem,) = reason["reasons"]  # type: ignore[misc]
    assert problem["code"] == "mask_unknown_class"
    assert "33" in problem["message"] and "250" in problem["message"]
    assert set(status_by_key(data_stack).values()) == {"quarantined"}
    assert_every_upload_accounted_for_once(data_stack)


def test_a_corrected_label_brings_its_image_back_from_quarantine(data_stack: OfflineStack) -> None:
    # The label was wrong, so the pair went to quarantine; the annotator uploads a corrected one.
    upload_pair(data_stack, "b1", "street", scene(2)._replace_label(bad_label([0, 33, 250])))
    drain(data_stack)
    corrected = upload(data_stack, "incoming/b1/labels/street.png", scene(2).label)

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert objects(data_stack, "dataset/") == ["dataset/images/b1/street.jpg", "dataset/labels/b1/street.png"]
    # The wrong label stays in quarantine with its reason; the image, now curated, left it.
    assert objects(data_stack, "quarantine/") == [
        "quarantine/b1/labels/street.png",
        "quarantine/b1/labels/street.png.reason.json",
    ]
    statuses = {key_version: record["status"] for key_version, record in fates(data_stack).items()}
    assert statuses[("incoming/b1/labels/street.png", corrected)] == "curated"
    assert sorted(statuses.values()) == ["curated", "curated", "superseded"]
    assert landing_versions(data_stack) == set()
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"


def test_a_label_set_aside_as_a_duplicates_partner_is_curated_with_a_new_image(data_stack: OfflineStack) -> None:
    upload_pair(data_stack, "monday", "a", scene(3))
    drain(data_stack)
    upload_pair(data_stack, "monday", "b", scene(3))  # the same photo under another name: a duplicate
    drain(data_stack)
    assert objects(data_stack, "quarantine/monday/labels/") == [
        "quarantine/monday/labels/b.png",
        "quarantine/monday/labels/b.png.reason.json",
    ]

    # The right photo for "b" (its label was right all along).
    upload(data_stack, "incoming/monday/images/b.jpg", scene(6).image)
    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert "dataset/labels/monday/b.png" in objects(data_stack, "dataset/")
    assert objects(data_stack, "quarantine/monday/labels/") == []
    label = data_stack.aws.s3.get_object(Bucket=data_stack.ref("DataBucket"), Key="dataset/labels/monday/b.png")
    assert label["Body"].read() == scene(3).label
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"


def test_a_file_that_is_not_what_its_name_says_is_quarantined_alone(
    data_stack: OfflineStack,
) -> None:
    upload(data_stack, "incoming/b2/images/readme.txt", b"notes")
    upload(data_stack, "incoming/b2/images/x.jpg", b"\x89PNG but not really")

    drain(data_stack)

    codes = {record["key"]: record["reasons"][0]["code"] for record in fates(data_stack).values()}
    assert codes == {
        "incoming/b2/images/readme.txt": "unsupported_extension",
        "incoming/b2/images/x.jpg": "not_an_image",
    }
    assert_every_upload_accounted_for_once(data_stack)


def test_the_same_image_uploaded_in_a_later_batch_is_recorded_as_a_duplicate(
    data_stack: OfflineStack,
) -> None:
    upload_pair(data_stack, "monday", "a", scene(3))
    drain(data_stack)
    upload_pair(data_stack, "tuesday", "a", scene(3))  # same name, same bytes, next batch

    drain(data_stack)

    (duplicate,) = [r for r in fates(data_stack).values() if r["key"].startswith("incoming/tuesday/images")]
    assert duplicate["status"] == "duplicate"
    assert duplicate["duplicate_of"] == "monday/images/a.jpg"
    assert objects(data_stack, "dataset/images/") == ["dataset/images/monday/a.jpg"]
    assert_every_upload_accounted_for_once(data_stack)


def test_an_image_uploaded_again_with_new_content_supersedes_the_first(
    data_stack: OfflineStack,
) -> None:
    upload(data_stack, "incoming/b3/images/s.jpg", scene(4).image)
    drain(data_stack)
    upload_pair(data_stack, "b3", "s", scene(5))

    drain(data_stack)

    statuses = sorted(record["status"] for record in fates(data_stack).values())
    assert statuses == ["curated", "curated", "superseded"]
    assert_every_upload_accounted_for_once(data_stack)


def test_a_quick_reupload_of_a_curated_pair_is_neither_hidden_nor_lost(data_stack: OfflineStack) -> None:
    bucket = data_stack.ref("DataBucket")
    image, label = "incoming/b5/images/x.jpg", "incoming/b5/labels/x.png"
    upload(data_stack, image, scene(11).image)
    drain(data_stack)
    # The label, then a corrected label seconds later: both land before the intake gets to the
    # first, so the first one's removal from the landing zone happens after the second arrived.
    upload(data_stack, label, scene(11).label)
    corrected = upload(data_stack, label, scene(12).label)

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert delete_markers(data_stack) == [], "a key-level delete hid a newer upload"
    assert landing_versions(data_stack) == set(), "every landing version was copied, then removed"
    statuses = {key_version: record["status"] for key_version, record in fates(data_stack).items()}
    assert statuses[(label, corrected)] == "curated"
    assert sorted(statuses.values()) == ["curated", "curated", "superseded"]
    curated = data_stack.aws.s3.get_object(Bucket=bucket, Key="dataset/labels/b5/x.png")["Body"].read()
    assert curated == scene(12).label, "dataset/ must hold the corrected label"
    assert_every_upload_accounted_for_once(data_stack)


def test_a_redelivered_notification_is_processed_once(data_stack: OfflineStack) -> None:
    queue = data_stack.ref("IntakeQueue")
    drain(data_stack)  # S3's s3:TestEvent
    upload(data_stack, "incoming/b4/images/s.jpg", scene(6).image)
    message = data_stack.aws.sqs.receive_message(QueueUrl=queue)["Messages"][0]
    data_stack.aws.sqs.change_message_visibility(
        QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    data_stack.aws.sqs.send_message(QueueUrl=queue, MessageBody=message["Body"])  # S3 said it twice

    assert drain(data_stack) == 2

    intake_runs = [i for i in data_stack.runtime.invocations if "Intake" in i.function]
    assert all(not i.failed for i in intake_runs)
    assert list(status_by_key(data_stack).values()) == ["pending"]


def test_one_bad_message_fails_alone_and_the_rest_of_the_batch_is_kept(stack: OfflineStack) -> None:
    queue = stack.ref("IntakeQueue")
    drain(stack)  # S3's s3:TestEvent
    upload(stack, "incoming/b5/_COMPLETE", b"")
    stack.aws.sqs.send_message(QueueUrl=queue, MessageBody="not an S3 notification")
    (mapping,) = stack.poller.mappings

    outcome = stack.poller.poll_once(mapping, wait_seconds=0.1)

    assert outcome.received == 2
    assert len(outcome.failed_ids) == 1
    assert status_by_key(stack) == {"incoming/b5/_COMPLETE": "marker"}
    assert queue_depth(stack, "IntakeQueue") == 1  # only the bad one waits to be redelivered


def test_a_message_that_keeps_failing_ends_in_the_dead_letter_queue(stack: OfflineStack) -> None:
    drain(stack)
    stack.aws.sqs.send_message(QueueUrl=stack.ref("IntakeQueue"), MessageBody="{broken json")
    (mapping,) = stack.poller.mappings
    deliveries = 0

    deadline = time.monotonic() + 15
    while queue_depth(stack, "IntakeDeadLetterQueue") == 0 and time.monotonic() < deadline:
        # Failed messages come back after the visibility timeout (1 s in these tests).
        deliveries += len(stack.poller.poll_once(mapping, wait_seconds=0.3).failed_ids)

    assert deliveries == 2  # maxReceiveCount
    assert queue_depth(stack, "IntakeDeadLetterQueue") == 1
    assert queue_depth(stack, "IntakeQueue") == 0
    (dead,) = stack.aws.sqs.receive_message(QueueUrl=stack.ref("IntakeDeadLetterQueue"))["Messages"]
    assert dead["Body"] == "{broken json"


def test_objects_outside_the_landing_zone_trigger_nothing(stack: OfflineStack) -> None:
    stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key="reports/batches/b1/report.json", Body=b"{}")

    drain(stack)

    assert fates(stack) == {}


def forged(bucket: str, key: str, version: str | None, event_name: str = "ObjectCreated:Put") -> str:
    """An S3 notification as AWS writes it, naming whatever the forger wants."""
    event = load_event("s3_object_created_aws.json")
    (record,) = event["Records"]
    record["eventName"] = event_name
    record["s3"]["bucket"] = {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"}
    record["s3"]["object"].update({"key": quote_plus(key), "versionId": version, "size": 2})
    return json.dumps(event)


def test_forged_events_for_a_manifest_another_bucket_or_a_deletion_change_nothing(stack: OfflineStack) -> None:
    s3, bucket = stack.aws.s3, stack.ref("DataBucket")
    drain(stack)  # S3's s3:TestEvent
    manifest = "dataset/manifests/ds-1.jsonl"
    manifest_version = s3.put_object(Bucket=bucket, Key=manifest, Body=b"{}\n")["VersionId"]
    s3.create_bucket(Bucket="someone-elses-bucket")
    s3.put_bucket_versioning(Bucket="someone-elses-bucket", VersioningConfiguration={"Status": "Enabled"})
    theirs = s3.put_object(Bucket="someone-elses-bucket", Key="incoming/b/images/x.jpg", Body=scene(1).image)
    mine = upload(stack, "incoming/b/images/y.jpg", scene(2).image)
    drain(stack)  # the genuine upload: pending, waiting for its label
    for body in (
        forged(bucket, manifest, manifest_version),  # would "quarantine", that is delete, a manifest
        forged("someone-elses-bucket", "incoming/b/images/x.jpg", theirs["VersionId"]),
        forged(bucket, "incoming/b/images/y.jpg", mine, event_name="ObjectRemoved:Delete"),
    ):
        stack.aws.sqs.send_message(QueueUrl=stack.ref("IntakeQueue"), MessageBody=body)

    assert drain(stack) == 3

    intake = [i for i in stack.runtime.invocations if "Intake" in i.function]
    assert all(not i.failed and i.payload == {"batchItemFailures": []} for i in intake), "refused, not retried"
    assert queue_depth(stack, "IntakeDeadLetterQueue") == 0
    versions = s3.list_object_versions(Bucket=bucket, Prefix=manifest)
    assert [v["VersionId"] for v in versions.get("Versions", [])] == [manifest_version]
    assert versions.get("DeleteMarkers", []) == []
    elsewhere = s3.list_object_versions(Bucket="someone-elses-bucket")
    assert [v["VersionId"] for v in elsewhere["Versions"]] == [theirs["VersionId"]]
    assert elsewhere.get("DeleteMarkers", []) == []
    assert objects(stack, "quarantine/") == []
    assert status_by_key(stack) == {"incoming/b/images/y.jpg": "pending"}, "only the genuine upload has a fate"


def test_a_zero_byte_upload_is_quarantined_as_empty_and_nothing_reaches_the_dead_letter_queue(
    stack: OfflineStack,
) -> None:
    drain(stack)  # S3's s3:TestEvent
    upload(stack, "incoming/b6/images/blank.jpg", b"")

    drain(stack)

    assert queue_depth(stack, "IntakeDeadLetterQueue") == 0
    assert queue_depth(stack, "IntakeQueue") == 0
    assert status_by_key(stack) == {"incoming/b6/images/blank.jpg": "quarantined"}
    reason = read_json(stack, "quarantine/b6/images/blank.jpg.reason.json")
    assert [r["code"] for r in reason["reasons"]] == ["empty_file"]  # type: ignore[union-attr,index]
    assert landing_versions(stack) == set()
    assert_every_upload_accounted_for_once(stack)


@pytest.mark.parametrize("batch", ["..", "week\x0112"], ids=["dotdot", "control character"])
def test_an_upload_under_an_unsafe_batch_folder_is_quarantined_under_a_safe_key_with_its_bytes(
    data_stack: OfflineStack, batch: str
) -> None:
    key = f"incoming/{batch}/images/a.jpg"
    upload(data_stack, key, scene(1).image)

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    quarantined = prefixes.unsafe_quarantine_key(key)
    assert objects(data_stack, "quarantine/") == [quarantined, prefixes.reason_key(quarantined)]
    body = data_stack.aws.s3.get_object(Bucket=data_stack.ref("DataBucket"), Key=quarantined)["Body"].read()
    assert body == scene(1).image, "nothing lost on bad input"
    reason = read_json(data_stack, prefixes.reason_key(quarantined))
    assert reason["key"] == key
    assert [r["code"] for r in reason["reasons"]] == ["unsafe_name"]  # type: ignore[union-attr,index]
    assert status_by_key(data_stack) == {key: "quarantined"}
    assert objects(data_stack, "dataset/") == objects(data_stack, "incoming/") == []
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"


def _deep_key(start: str, length: int) -> str:
    """A landing key of `length` bytes: folders under `start` (no segment over 255 bytes)."""
    key = start + "d/" * ((length - len(start) - 1) // 2)  # then at least one "x": no trailing /
    return key + "x" * (length - len(key))


def test_keys_over_the_cap_are_quarantined_and_nothing_reaches_the_dead_letter_queue(data_stack: OfflineStack) -> None:
    over = _deep_key("incoming/long/", MAX_INCOMING_KEY_BYTES + 1)
    longest = _deep_key("incoming/long/", 1024)  # S3's longest key: its ledger sort key is hashed
    at_cap = _deep_key("incoming/long/", MAX_INCOMING_KEY_BYTES)
    batch, stem = "b" * 255, "s" * 251  # the longest pair a batch can hold: every segment at 255 bytes
    for key in (over, longest, at_cap):
        upload(data_stack, key, b"not an image")
    upload_pair(data_stack, batch, stem, scene(2))

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    for key in (over, longest):
        quarantined = prefixes.unsafe_quarantine_key(key)
        (reason,) = read_json(data_stack, prefixes.reason_key(quarantined))["reasons"]  # type: ignore[misc]
        assert reason["code"] == "unsafe_name"
        assert f"limit of {MAX_INCOMING_KEY_BYTES}" in reason["message"]
    # At the cap, the key's own quarantine copy and reason fit: judged like any stray file.
    own = read_json(data_stack, prefixes.reason_key("quarantine/" + at_cap.removeprefix("incoming/")))
    (reason,) = own["reasons"]  # type: ignore[misc]
    assert reason["code"] == "unexpected_file"
    assert objects(data_stack, "dataset/") == [
        f"dataset/images/{batch}/{stem}.jpg",
        f"dataset/labels/{batch}/{stem}.png",
    ]
    assert status_by_key(data_stack) == {
        over: "quarantined",
        longest: "quarantined",
        at_cap: "quarantined",
        f"incoming/{batch}/images/{stem}.jpg": "curated",
        f"incoming/{batch}/labels/{stem}.png": "curated",
    }
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"


def test_objects_above_the_multipart_threshold_are_curated_and_quarantined_in_parts(data_stack: OfflineStack) -> None:
    # Production copies in parts above CopyObject's 5 GiB; lowered here so small files take that path.
    data_stack.update_function_environment("IntakeFunction", COPY_MULTIPART_THRESHOLD_BYTES="64")
    upload(data_stack, "incoming/big/images/ok.jpg", scene(4).image)  # replaced below: not the one curated
    upload_pair(data_stack, "big", "ok", scene(5))
    upload_pair(data_stack, "big", "bad", scene(6)._replace_label(bad_label([0, 33])))

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    s3, bucket = data_stack.aws.s3, data_stack.ref("DataBucket")
    copied = {
        (r["key"], r["destination"]): r["destination_version"]
        for r in fates(data_stack).values()
        if r["status"] in {"curated", "quarantined"}
    }
    expected = {
        ("incoming/big/images/ok.jpg", "dataset/images/big/ok.jpg"): scene(5).image,
        ("incoming/big/labels/ok.png", "dataset/labels/big/ok.png"): scene(5).label,
        ("incoming/big/images/bad.jpg", "quarantine/big/images/bad.jpg"): scene(6).image,
        ("incoming/big/labels/bad.png", "quarantine/big/labels/bad.png"): bad_label([0, 33]),
    }
    assert set(copied) == set(expected)
    for (landing, destination), body in expected.items():
        version = s3.get_object(Bucket=bucket, Key=destination, VersionId=copied[(landing, destination)])
        assert version["Body"].read() == body, f"{destination} holds the bytes of the version recorded"
        assert version["ETag"].endswith('-1"'), f"{destination} was not copied in parts"
    assert status_by_key(data_stack)["incoming/big/images/ok.jpg"] == "curated"
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"


def test_uploads_encrypted_otherwise_than_with_the_stacks_key_are_refused_where_they_lie(
    data_stack: OfflineStack,
) -> None:
    # On AWS the bucket policy denies these uploads; offline it cannot (moto ignores its conditions),
    # so they reach the intake, as one would that got past a policy: refused, never the DLQ.
    other_key = data_stack.aws.kms.create_key()["KeyMetadata"]["Arn"]
    upload(
        data_stack, "incoming/enc/images/a.jpg", scene(1).image, ServerSideEncryption="aws:kms", SSEKMSKeyId=other_key
    )
    upload(data_stack, "incoming/enc/labels/a.png", scene(1).label)
    upload(data_stack, "incoming/enc/images/b.jpg", scene(2).image, ServerSideEncryption="AES256")
    upload(data_stack, "incoming/enc/labels/b.png", scene(2).label)
    upload_pair(data_stack, "enc", "c", scene(3))  # no headers: the bucket's default, the stack's key

    drain(data_stack)

    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert queue_depth(data_stack, "IntakeQueue") == 0
    assert status_by_key(data_stack) == {
        "incoming/enc/images/a.jpg": "refused",
        "incoming/enc/labels/a.png": "quarantined",
        "incoming/enc/images/b.jpg": "refused",
        "incoming/enc/labels/b.png": "quarantined",
        "incoming/enc/images/c.jpg": "curated",
        "incoming/enc/labels/c.png": "curated",
    }
    assert objects(data_stack, "incoming/") == ["incoming/enc/images/a.jpg", "incoming/enc/images/b.jpg"]
    for image, says in (("a.jpg", f"KMS key {other_key}, not the stack's key"), ("b.jpg", "encrypted with AES256")):
        reason = read_json(data_stack, f"quarantine/enc/images/{image}.reason.json")
        assert reason["status"] == "refused"
        (why,) = reason["reasons"]  # type: ignore[misc]
        assert why["code"] == "encryption_not_accepted"
        assert says in why["message"] and "without encryption headers" in why["message"]
    assert objects(data_stack, "dataset/") == ["dataset/images/enc/c.jpg", "dataset/labels/enc/c.png"]
    assert_every_upload_accounted_for_once(data_stack)
    assert audit(data_stack, "--grace-seconds", "0")[0] == 0, "bucket and ledger disagree"
