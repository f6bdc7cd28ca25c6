"""The intake handler, called with an SQS batch of S3 notifications as Lambda delivers it."""

from __future__ import annotations

import copy
import json
from typing import Any

from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.data_drops import scene

BATCH = "handler-test"


def _upload_street_scene(stack: OfflineStack) -> list[str]:
    """The annotator's upload; the VersionIds S3 gave the image and the label."""
    pair = scene(7)
    s3, bucket = stack.aws.s3, stack.ref("DataBucket")
    return [
        s3.put_object(Bucket=bucket, Key=f"incoming/{BATCH}/{name}", Body=body)["VersionId"]
        for name, body in (("images/street 1.jpg", pair.image), ("labels/street 1.png", pair.label))
    ]


def _as_aws_sends_it(event: dict[str, Any], versions: list[str]) -> dict[str, Any]:
    """AWS's notifications name the object version (moto's, in the event file, do not)."""
    named = copy.deepcopy(event)
    for record, version in zip(named["Records"], versions, strict=True):
        body = json.loads(record["body"])
        body["Records"][0]["s3"]["object"]["versionId"] = version
        record["body"] = json.dumps(body)
    return named


def _idempotency_records(stack: OfflineStack) -> list[dict[str, Any]]:
    return stack.aws.dynamodb.scan(TableName=stack.ref("IdempotencyTable"))["Items"]


def _redelivered_later(event: dict[str, Any]) -> dict[str, Any]:
    """The same notifications again, as SQS redelivers them: other message ids, other times."""
    again = copy.deepcopy(event)
    for index, record in enumerate(again["Records"]):
        body = json.loads(record["body"])
        body["Records"][0]["eventTime"] = "2026-12-03T10:00:00.000Z"
        record["body"] = json.dumps(body)
        record["messageId"] = f"redelivery-{index}"
    return again


def test_an_annotators_pair_named_without_versions_is_curated_and_nothing_fails(
    deployed: OfflineStack, handler: Any
) -> None:
    _upload_street_scene(deployed)

    response = handler("IntakeFunction")(load_event("sqs_s3_notifications.json"))

    assert response == {"batchItemFailures": []}
    listed = deployed.aws.s3.list_objects_v2(Bucket=deployed.ref("DataBucket"), Prefix="dataset/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [
        f"dataset/images/{BATCH}/street 1.jpg",
        f"dataset/labels/{BATCH}/street 1.png",
    ]


def test_a_redelivered_notification_is_recognised_by_its_object_version_alone(
    deployed: OfflineStack, handler: Any
) -> None:
    intake = handler("IntakeFunction")
    event = _as_aws_sends_it(load_event("sqs_s3_notifications.json"), _upload_street_scene(deployed))
    intake(event)
    first = _idempotency_records(deployed)

    response = intake(_redelivered_later(event))

    assert response == {"batchItemFailures": []}
    assert len(first) == 2, "one idempotency record per object version"
    assert _idempotency_records(deployed) == first, "a redelivery with another time is the same"
    assert all(r["id"]["S"].startswith("intake.object-version#") for r in first)


def test_a_new_version_of_the_same_key_is_processed_again(deployed: OfflineStack, handler: Any) -> None:
    intake = handler("IntakeFunction")
    event = load_event("sqs_s3_notifications.json")
    intake(_as_aws_sends_it(event, _upload_street_scene(deployed)))

    again = _upload_street_scene(deployed)  # the same names uploaded again: new object versions
    intake(_as_aws_sends_it(_redelivered_later(event), again))

    assert len(_idempotency_records(deployed)) == 4


def test_a_message_that_is_no_notification_fails_alone(deployed: OfflineStack, handler: Any) -> None:
    event = load_event("sqs_s3_notifications.json")
    _upload_street_scene(deployed)
    event["Records"][1]["body"] = "{not json"

    response = handler("IntakeFunction")(event)

    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][1]["messageId"]}]}
