"""The speed fixes in `retrain/local/endpoint/moto_fixes.py` keep moto's answers as they were.

Each replaces work moto repeats on every request (counting a queue's messages, re-importing S3's
URL table, listing its own package) with the same answer got cheaply: these tests check the
answers, not the speed (`benchmarks/bench_intake.py` measures that).
"""

from __future__ import annotations

import hashlib

import boto3
import pytest
from moto import backends, mock_aws
from moto.dynamodb.models import dynamodb_backends
from moto.s3.models import s3_backends
from moto.s3.utils import _VersionedKeyStore
from moto.sqs.models import sqs_backends

from retrain.local.endpoint import moto_fixes

moto_fixes.apply()
REGION = "us-east-1"
ACCOUNT = "123456789012"


@mock_aws
def test_a_message_is_delivered_within_its_retention_period_and_not_after() -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="q", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="fresh")
    sqs.send_message(QueueUrl=url, MessageBody="stale")
    queue = sqs_backends[ACCOUNT][REGION].get_queue("q")
    stale = next(m for m in queue._messages if m.body == "stale")
    # Sent 61 s ago: past its 60 s retention (moto types the field None until a send sets it).
    stale.sent_timestamp = int(stale.sent_timestamp or 0) - 61_000  # type: ignore[assignment]

    answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)

    assert [m["Body"] for m in answer["Messages"]] == ["fresh"]


@mock_aws
def test_queue_counts_are_exact_outside_a_send() -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    for index in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=str(index))
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)

    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

    assert attributes["ApproximateNumberOfMessages"] == "2"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "1"
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"


@mock_aws
def test_a_fifo_queue_with_content_based_deduplication_still_deduplicates() -> None:
    # The one thing a send reads from the queue's attributes.
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="q.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})[
        "QueueUrl"
    ]
    for _ in range(2):
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")

    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])

    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "1"


@mock_aws
def test_s3_url_patterns_follow_a_changed_custom_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = s3_backends[ACCOUNT]["global"]
    before = set(backend.urls)
    monkeypatch.setenv("MOTO_S3_CUSTOM_ENDPOINTS", "http://s3.example.internal:4566")

    after = set(backend.urls)

    assert any("example" in url for url in after - before)
    assert backend.urls.keys() == after  # and kept, not rebuilt, while the setting stays


def test_moto_modules_are_those_of_the_installed_package() -> None:
    listed = backends.list_of_moto_modules()

    assert {"s3", "sqs", "dynamodb", "stepfunctions"} <= set(listed)
    assert list(listed) == list(moto_fixes._moto_modules_listed())


@mock_aws
def test_an_object_replaced_before_its_put_is_answered_keeps_its_etag_and_multipart_etags_stay() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="race")
    backend = s3_backends[ACCOUNT]["aws"]
    first = backend.put_object("race", "k", b"one")
    backend.put_object("race", "k", b"two")  # another writer of the key: moto closes the first's bytes

    assert first.etag == f'"{hashlib.md5(b"one").hexdigest()}"'
    upload = s3.create_multipart_upload(Bucket="race", Key="big")["UploadId"]
    part = s3.upload_part(Bucket="race", Key="big", UploadId=upload, PartNumber=1, Body=b"x" * 10)["ETag"]
    s3.complete_multipart_upload(
        Bucket="race", Key="big", UploadId=upload, MultipartUpload={"Parts": [{"ETag": part, "PartNumber": 1}]}
    )
    assert s3.head_object(Bucket="race", Key="big")["ETag"].endswith('-1"')


def test_a_bucket_listing_leaves_out_a_key_deleted_while_it_runs() -> None:
    store = _VersionedKeyStore()
    store["kept"] = "kept, v1"
    store["kept"] = "kept, v2"
    # What the listing took at its start still names a key another request has deleted since.
    store._self_iterable = lambda: {"kept": None, "deleted": None}  # type: ignore[method-assign]

    assert list(store.iterlists()) == [("kept", ["kept, v1", "kept, v2"])]
    assert list(store.items()) == [("kept", "kept, v2")]
    assert list(store.values()) == ["kept, v2"]


@mock_aws
def test_a_query_reads_the_table_as_it_was_when_another_request_adds_an_item() -> None:
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    dynamodb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for pk in ("a", "b"):
        dynamodb.put_item(TableName="t", Item={"pk": {"S": pk}, "sk": {"S": "1"}})
    table = dynamodb_backends[ACCOUNT][REGION].get_table("t")

    class AddsAnItemWhenRead(dict):  # type: ignore[type-arg]
        """One partition's items; reading them lets another request add a partition (a thread would)."""

        def values(self):  # type: ignore[no-untyped-def,override]
            table.items.setdefault("added meanwhile", {})
            return super().values()

    table.items = {pk: AddsAnItemWhenRead(items) for pk, items in table.items.items()}

    assert [item.hash_key.value for item in table.all_items()] == ["a", "b"]
