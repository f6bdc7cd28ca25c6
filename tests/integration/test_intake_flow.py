"""An annotator's upload travels S3 -> SQS -> the event-source mapping -> the intake function."""

from __future__ import annotations

import time

from retrain.local.stack import OfflineStack
from tests.integration.helpers import queue_depth


def ledger(stack: OfflineStack) -> dict[str, dict[str, str]]:
    items = stack.aws.dynamodb.scan(TableName=stack.ref("LedgerTable"))["Items"]
    return {
        item["key"]["S"]: {k: next(iter(v.values())) for k, v in item.items()} for item in items
    }


def drain(stack: OfflineStack) -> None:
    (mapping,) = stack.poller.mappings
    while stack.poller.poll_once(mapping, wait_seconds=0.1).received:
        pass


def test_every_uploaded_object_is_in_the_ledger_under_its_real_name(stack: OfflineStack) -> None:
    bucket = stack.ref("DataBucket")
    keys = [
        "incoming/munich-11/images/café corner 1+2.jpg",
        "incoming/munich-11/labels/café corner 1+2.png",
        "incoming/munich-11/_COMPLETE",
    ]
    for key in keys:
        stack.aws.s3.put_object(Bucket=bucket, Key=key, Body=b"bytes of " + key.encode())

    drain(stack)

    recorded = ledger(stack)
    assert sorted(recorded) == sorted(keys)
    image = recorded[keys[0]]
    assert image["batch"] == "munich-11"
    assert image["status"] == "received"
    # moto's notifications carry no versionId (AWS's do): the item is keyed by the ETag then.
    assert image["sk"] == f"version#{image['etag']}"
    assert queue_depth(stack, "IntakeQueue") == 0
    assert queue_depth(stack, "IntakeDeadLetterQueue") == 0


def test_objects_outside_the_landing_zone_trigger_nothing(stack: OfflineStack) -> None:
    stack.aws.s3.put_object(
        Bucket=stack.ref("DataBucket"), Key="reports/b1/report.json", Body=b"{}"
    )

    drain(stack)

    assert ledger(stack) == {}


def test_one_bad_message_fails_alone_and_the_rest_of_the_batch_is_kept(
    stack: OfflineStack,
) -> None:
    queue = stack.ref("IntakeQueue")
    drain(stack)  # S3's s3:TestEvent
    stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key="incoming/b2/_COMPLETE", Body=b"")
    stack.aws.sqs.send_message(QueueUrl=queue, MessageBody="not an S3 notification")
    (mapping,) = stack.poller.mappings

    outcome = stack.poller.poll_once(mapping, wait_seconds=0.1)

    assert outcome.received == 2
    assert len(outcome.failed_ids) == 1
    assert list(ledger(stack)) == ["incoming/b2/_COMPLETE"]
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


def test_the_background_poller_delivers_without_being_asked(running_stack: OfflineStack) -> None:
    running_stack.aws.s3.put_object(
        Bucket=running_stack.ref("DataBucket"), Key="incoming/b3/images/a.jpg", Body=b"jpeg"
    )

    deadline = time.monotonic() + 15
    while "incoming/b3/images/a.jpg" not in ledger(running_stack) and time.monotonic() < deadline:
        time.sleep(0.1)

    assert "incoming/b3/images/a.jpg" in ledger(running_stack)
