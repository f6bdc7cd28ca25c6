"""The intake handler, called with an SQS batch of S3 notifications as Lambda delivers it."""

from __future__ import annotations

import copy
import json
import logging
import uuid
from typing import Any
from urllib.parse import unquote_plus

import pytest

from functions.data.ledger import Ledger
from functions.intake.logic import Intake
from retrain.local.cloudformation.stack import OfflineStack
from retrain.local.lambda_runtime.contract import LambdaContext
from tests.conftest import load_event
from tests.integration.data_drops import scene
from tests.integration.helpers import queue_depth

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


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_message_that_is_no_notification_fails_alone_and_the_log_says_why(
    deployed: OfflineStack, handler: Any
) -> None:
    event = load_event("sqs_s3_notifications.json")
    _upload_street_scene(deployed)
    event["Records"][1]["body"] = "{not json"
    intake = handler("IntakeFunction")
    kept = _Kept()
    logging.getLogger("intake").addHandler(kept)  # the Powertools logger of the intake's service
    try:
        response = intake(event)
    finally:
        logging.getLogger("intake").removeHandler(kept)

    bad = event["Records"][1]["messageId"]
    assert response == {"batchItemFailures": [{"itemIdentifier": bad}]}
    # Lambda's poller is silent about a failed record: the function's own log is all there is.
    failed = [r for r in kept.records if r.getMessage().startswith("record failed")]
    assert [(r.levelname, r.message_id, r.deliveries, r.error) for r in failed] == [  # type: ignore[attr-defined]
        ("WARNING", bad, 1, "InvalidEventError")
    ]
    assert "message body is not JSON" in failed[0].reason  # type: ignore[attr-defined]


# ------------------------------------------------------- running out of time --
TIMEOUT_MS = 60_000  # the template's FunctionTimeoutSeconds
OBJECT_MS = 20_000  # what each object "takes" here: three fit before the 10 s margin, not four


class _Clock:
    """The invocation's time as the intake spends it: each object it processes costs OBJECT_MS."""

    def __init__(self) -> None:
        self.spent_ms = 0

    def context(self, stack: OfflineStack) -> LambdaContext:
        spec = stack.runtime.spec(stack.ref("IntakeFunction"))
        context = LambdaContext(spec, stack.runtime.arn(spec.name), str(uuid.uuid4()))
        self.spent_ms = 0
        context.get_remaining_time_in_millis = lambda: max(0, TIMEOUT_MS - self.spent_ms)  # type: ignore[method-assign]
        return context


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    spent = _Clock()
    process = Intake.process

    def slow(self: Intake, obj: Any) -> Any:
        spent.spent_ms += OBJECT_MS
        return process(self, obj)

    monkeypatch.setattr(Intake, "process", slow)
    return spent


def _receive(stack: OfflineStack) -> list[dict[str, Any]]:
    """Every message on the intake queue now, as Lambda's poller receives them (S3's test event
    taken off); they stay in flight until deleted or made visible again."""
    queue, messages = stack.ref("IntakeQueue"), []
    while batch := stack.aws.sqs.receive_message(
        QueueUrl=queue, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
    ).get("Messages", []):
        for message in batch:
            if json.loads(message["Body"]).get("Event") == "s3:TestEvent":
                stack.aws.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            else:
                messages.append(message)
    return messages


def _as_lambda_delivers(stack: OfflineStack, messages: list[dict[str, Any]]) -> dict[str, Any]:
    queue_arn = stack.aws.sqs.get_queue_attributes(QueueUrl=stack.ref("IntakeQueue"), AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": stack.options.region,
            }
            for m in messages
        ]
    }


def _key_of(message: dict[str, Any]) -> str:
    return unquote_plus(json.loads(message["Body"])["Records"][0]["s3"]["object"]["key"])


def _settle(stack: OfflineStack, messages: list[dict[str, Any]], response: dict[str, Any]) -> set[str]:
    """What Lambda's poller does with the answer: delete what succeeded; the failures come back
    (at once here, as if their visibility timeout had passed). The keys sent back."""
    queue = stack.ref("IntakeQueue")
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    for message in messages:
        if message["MessageId"] in failed:
            stack.aws.sqs.change_message_visibility(
                QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        else:
            stack.aws.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    return {_key_of(m) for m in messages if m["MessageId"] in failed}


def _upload_images(stack: OfflineStack, names: list[str]) -> None:
    for name in names:
        stack.aws.s3.put_object(
            Bucket=stack.ref("DataBucket"), Key=f"incoming/{BATCH}/images/{name}.jpg", Body=scene(1).image
        )


def _recorded(stack: OfflineStack) -> set[str]:
    return {record.key for record in Ledger(stack.aws.dynamodb, stack.ref("LedgerTable")).files(BATCH)}


def test_records_left_when_time_runs_short_go_back_to_the_queue_unstarted(
    deployed: OfflineStack, handler: Any, clock: _Clock
) -> None:
    _upload_images(deployed, ["a", "b", "c", "d", "e"])
    messages = _receive(deployed)
    keys = [_key_of(m) for m in messages]

    response = handler("IntakeFunction")(_as_lambda_delivers(deployed, messages), clock.context(deployed))

    # 60 s, then 40 s, then 20 s left: started; then 0 s, below the 10 s margin: sent back.
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == [m["MessageId"] for m in messages[3:]]
    assert _recorded(deployed) == set(keys[:3]), "the records sent back were not touched"
    assert len(_idempotency_records(deployed)) == 3, "nor claimed: their redelivery is processed afresh"


def test_a_record_sent_back_for_time_goes_first_when_it_comes_back_and_never_reaches_the_dlq(
    deployed: OfflineStack, handler: Any, clock: _Clock
) -> None:
    sqs, queue = deployed.aws.sqs, deployed.ref("IntakeQueue")
    dead = sqs.get_queue_attributes(QueueUrl=deployed.ref("IntakeDeadLetterQueue"), AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    # Two deliveries at most: a record sent back twice would be dead.
    sqs.set_queue_attributes(
        QueueUrl=queue,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dead, "maxReceiveCount": "2"})},
    )
    intake = handler("IntakeFunction")
    _upload_images(deployed, ["a0", "a1", "a2", "a3", "a4", "a5"])
    first = _receive(deployed)
    sent_back = _settle(deployed, first, intake(_as_lambda_delivers(deployed, first), clock.context(deployed)))
    assert len(sent_back) == 3

    # Two fresh uploads join them, and SQS hands the batch over fresh ones first (it keeps no order).
    _upload_images(deployed, ["b0", "b1"])
    second = sorted(_receive(deployed), key=lambda m: int(m["Attributes"]["ApproximateReceiveCount"]))
    assert {_key_of(m) for m in second[2:]} == sent_back, "the fresh ones first, the ones sent back last"
    sent_back_again = _settle(deployed, second, intake(_as_lambda_delivers(deployed, second), clock.context(deployed)))

    assert not sent_back & sent_back_again, "a record sent back once went ahead of the fresh ones"
    third = _receive(deployed)
    assert {_key_of(m) for m in third} == sent_back_again
    _settle(deployed, third, intake(_as_lambda_delivers(deployed, third), clock.context(deployed)))
    assert _receive(deployed) == []
    assert queue_depth(deployed, "IntakeDeadLetterQueue") == 0
    assert len(_recorded(deployed)) == 8, "every upload processed"
