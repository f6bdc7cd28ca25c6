"""The intake handler, called with an SQS batch of S3 notifications as Lambda delivers it."""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from botocore.exceptions import ClientError

from functions.common.errors import AwsServiceBusyError
from functions.data.ledger import Ledger
from functions.intake.logic import Intake
from retrain.local.cloudformation.stack import OfflineStack
from retrain.local.lambda_runtime.contract import LambdaContext
from tests.conftest import load_event
from tests.integration.data_drops import scene
from tests.integration.helpers import queue_depth
from tests.unit.validation.corpus import many_scans_jpeg

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


def test_the_crafted_jpeg_is_refused_and_the_pair_in_its_batch_curated_by_a_child_without_credentials(
    deployed: OfflineStack, handler: Any
) -> None:
    """The handler as deployed: its files are checked in its DecoderProcess, whose environment holds
    none of the function's AWS variables, and the crafted JPEG never reaches a decoder."""
    intake = handler("IntakeFunction", DECODE_TIMEOUT_SECONDS="1")
    decoder = sys.modules["functions.intake.app"].decoder
    _upload_street_scene(deployed)
    deployed.aws.s3.put_object(
        Bucket=deployed.ref("DataBucket"), Key=f"incoming/{BATCH}/images/crafted.jpg", Body=many_scans_jpeg()
    )
    messages = _receive(deployed)

    started = time.monotonic()
    response = intake(_as_lambda_delivers(deployed, messages))

    assert response == {"batchItemFailures": []}
    assert time.monotonic() - started < 5
    fates = {r.key: r for r in Ledger(deployed.aws.dynamodb, deployed.ref("LedgerTable")).files(BATCH)}
    crafted = fates[f"incoming/{BATCH}/images/crafted.jpg"]
    assert [reason.code for reason in crafted.reasons] == ["jpeg_too_many_scans"]
    pair = (f"incoming/{BATCH}/images/street 1.jpg", f"incoming/{BATCH}/labels/street 1.png")
    assert {fates[key].status.value for key in pair} == {"curated"}
    assert decoder.limit_seconds == 1.0
    assert decoder.pid is not None, "the checks ran in the child"
    names = {entry.split(b"=", 1)[0] for entry in Path(f"/proc/{decoder.pid}/environ").read_bytes().split(b"\0")}
    assert "AWS_ACCESS_KEY_ID" in os.environ, "the function has credentials"
    assert not {name for name in names if name.startswith(b"AWS")}, "the child has none"
    decoder.close()


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
            try:
                stack.aws.sqs.change_message_visibility(
                    QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
            except ClientError:
                failed.discard(message["MessageId"])  # the function deleted it itself: it is done
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


def test_records_left_when_time_runs_short_go_back_to_the_queue_unstarted_as_new_messages(
    deployed: OfflineStack, handler: Any, clock: _Clock
) -> None:
    _upload_images(deployed, ["a", "b", "c", "d", "e"])
    messages = _receive(deployed)
    keys = [_key_of(m) for m in messages]

    response = handler("IntakeFunction")(_as_lambda_delivers(deployed, messages), clock.context(deployed))

    # 60 s, then 40 s, then 20 s left: started; then 0 s, below the 15 s margin: sent again.
    assert response == {"batchItemFailures": []}, "the originals are done: their receive counts end with them"
    _settle(deployed, messages, response)
    assert _recorded(deployed) == set(keys[:3]), "the records sent again were not touched"
    assert len(_idempotency_records(deployed)) == 3, "nor claimed: their new messages are processed afresh"
    again = _receive(deployed)
    assert sorted(_key_of(m) for m in again) == sorted(keys[3:])
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"1"}, "new messages: no try spent"


def _dead_letter_arn(stack: OfflineStack) -> str:
    dead = stack.aws.sqs.get_queue_attributes(QueueUrl=stack.ref("IntakeDeadLetterQueue"), AttributeNames=["QueueArn"])
    return dead["Attributes"]["QueueArn"]


def _redrive_after(stack: OfflineStack, deliveries: int) -> None:
    """The queue's RedrivePolicy (template.yaml's IntakeMaxReceiveCount), lowered for the story."""
    stack.aws.sqs.set_queue_attributes(
        QueueUrl=stack.ref("IntakeQueue"),
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": _dead_letter_arn(stack), "maxReceiveCount": deliveries})
        },
    )


def test_a_record_left_for_time_again_and_again_never_reaches_the_dlq(
    deployed: OfflineStack, handler: Any, clock: _Clock
) -> None:
    _redrive_after(deployed, 2)  # a record sent back twice as a failure would be dead
    intake = handler("IntakeFunction", MAX_RECEIVE_COUNT="2")
    _upload_images(deployed, [f"a{i}" for i in range(8)])
    rounds = 0
    while messages := _receive(deployed):
        rounds += 1
        _settle(deployed, messages, intake(_as_lambda_delivers(deployed, messages), clock.context(deployed)))

    assert rounds == 3, "three records an invocation: 8 took three, 5 of them waited once, 2 twice"
    assert queue_depth(deployed, "IntakeDeadLetterQueue") == 0
    assert len(_recorded(deployed)) == 8, "every upload processed"


POISON_MS = 40_000  # what the poison record "takes" before it fails


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> str:
    """A record that fails every time, slowly (say an S3 read that keeps failing after its
    retries): its object is `poison.jpg`."""
    process = Intake.process  # the clock's: every object costs OBJECT_MS

    def failing(self: Intake, obj: Any) -> Any:
        if obj.key.endswith("/poison.jpg"):
            clock.spent_ms += POISON_MS
            raise AwsServiceBusyError("S3 still failing after botocore's retries")
        return process(self, obj)

    monkeypatch.setattr(Intake, "process", failing)
    return "poison"


def _invoke(intake: Any, stack: OfflineStack, messages: list[dict[str, Any]], clock: _Clock) -> dict[str, Any]:
    """The handler's answer as Lambda's poller takes it: an error (Powertools raises when every
    record of the batch failed) fails every record."""
    try:
        return intake(_as_lambda_delivers(stack, messages), clock.context(stack))  # type: ignore[no-any-return]
    except BatchProcessingError:
        return {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_poison_record_reaches_the_dlq_alone_and_every_healthy_one_is_processed(
    deployed: OfflineStack, handler: Any, clock: _Clock, poison: str, seed: int
) -> None:
    """SQS's redelivery and dead-lettering as moto plays them (a real RedrivePolicy), batches in an
    order SQS does not promise (shuffled): the poison is tried on its last delivery, fails, and is
    moved to the DLQ; no healthy message is ever failed with it, nor left to wait as a failure."""
    order = random.Random(seed)
    _redrive_after(deployed, 3)
    intake = handler("IntakeFunction", MAX_RECEIVE_COUNT="3")
    kept = _Kept()
    logging.getLogger("intake").addHandler(kept)
    _upload_images(deployed, [poison, *(f"h{i}" for i in range(6))])
    rounds = 0
    try:
        while (messages := _receive(deployed)) and rounds < 10:
            rounds += 1
            order.shuffle(messages)
            failed = _settle(deployed, messages, _invoke(intake, deployed, messages, clock))
            assert failed <= {f"incoming/{BATCH}/images/{poison}.jpg"}, f"round {rounds}: only the poison fails"
    finally:
        logging.getLogger("intake").removeHandler(kept)

    assert queue_depth(deployed, "IntakeQueue") == 0
    assert queue_depth(deployed, "IntakeDeadLetterQueue") == 1
    (dead,) = deployed.aws.sqs.receive_message(QueueUrl=deployed.ref("IntakeDeadLetterQueue"))["Messages"]
    assert _key_of(dict(dead)) == f"incoming/{BATCH}/images/{poison}.jpg"
    assert _recorded(deployed) == {f"incoming/{BATCH}/images/h{i}.jpg" for i in range(6)}, "every healthy one done"
    tries = [r.deliveries for r in kept.records if r.getMessage().startswith("record failed")]  # type: ignore[attr-defined]
    assert tries[-1] == 3, "the poison had its last try before the DLQ"


class _Stopped(BaseException):
    """Lambda stopping the function mid-record (its timeout, or the process crashing): nothing
    after it runs, and nothing is answered. A BaseException, so no `except Exception` sees it."""


@pytest.fixture
def killer(monkeypatch: pytest.MonkeyPatch) -> str:
    """A record that ends its whole invocation, every time: its object is `killer.jpg`."""
    process = Intake.process

    def stopping(self: Intake, obj: Any) -> Any:
        if obj.key.endswith("/killer.jpg"):
            raise _Stopped
        return process(self, obj)

    monkeypatch.setattr(Intake, "process", stopping)
    return "killer"


def _invoke_until_stopped(intake: Any, stack: OfflineStack, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """As Lambda's poller sees it: an invocation that was stopped (or raised) failed every record."""
    every = {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}
    try:
        return intake(_as_lambda_delivers(stack, messages))  # type: ignore[no-any-return]
    except (_Stopped, BatchProcessingError):
        return every


def _visibility_timeout_passes(stack: OfflineStack) -> None:
    """What the queue's visibility timeout (360 s, six function timeouts) lets pass before a
    stopped invocation's records come back: the idempotency records it left in progress expire,
    so the redelivery runs the record again instead of meeting "already in progress"."""
    table = stack.ref("IdempotencyTable")
    for item in stack.aws.dynamodb.scan(TableName=table)["Items"]:
        if item.get("status", {}).get("S") == "INPROGRESS":
            stack.aws.dynamodb.update_item(
                TableName=table,
                Key={"id": item["id"]},
                UpdateExpression="SET in_progress_expiration = :past",
                ExpressionAttributeValues={":past": {"N": "0"}},
            )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_record_that_ends_its_invocation_every_time_reaches_the_dlq_alone(
    deployed: OfflineStack, handler: Any, killer: str, seed: int
) -> None:
    """Each time the killer runs, Lambda returns its whole batch: only what the function deleted
    itself before starting it stays done. Redelivered, the killer is known by the marker it left,
    goes last, and takes nothing with it; healthy records that came back with it are done on a
    later delivery, never in the DLQ."""
    order = random.Random(seed)
    _redrive_after(deployed, 3)
    intake = handler("IntakeFunction", MAX_RECEIVE_COUNT="3")
    _upload_images(deployed, [killer, *(f"h{i}" for i in range(6))])
    rounds = 0
    while (messages := _receive(deployed)) and rounds < 10:
        rounds += 1
        order.shuffle(messages)
        _settle(deployed, messages, _invoke_until_stopped(intake, deployed, messages))
        _visibility_timeout_passes(deployed)

    assert queue_depth(deployed, "IntakeQueue") == 0
    dead = deployed.aws.sqs.receive_message(QueueUrl=deployed.ref("IntakeDeadLetterQueue"), MaxNumberOfMessages=10)
    assert [_key_of(dict(m)) for m in dead.get("Messages", [])] == [f"incoming/{BATCH}/images/{killer}.jpg"]
    assert _recorded(deployed) == {f"incoming/{BATCH}/images/h{i}.jpg" for i in range(6)}, "every healthy one done"
