"""S3 and DynamoDB throttle in bursts when a team uploads thousands of files: nothing is lost."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from retrain.local.stack import OfflineStack
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    drain,
    scene,
    status_by_key,
    upload_pair,
)

# What the services answer when they throttle: DynamoDB (JSON protocol) and S3 (XML, 503).
THROTTLED = {
    "dynamodb": (
        400,
        b'{"__type":"ThrottlingException","message":"Rate exceeded"}',
    ),
    "s3": (
        503,
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ),
}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class Throttler:
    """Answers the first `times` calls of each operation with a throttling error, on the wire
    level (before-send), so botocore's own retry logic sees them as it would on AWS.

    botocore calls every before-send handler and uses the first answer, so moto still executes
    a throttled request behind our answer. Only operations for which that changes nothing are
    throttled here (reads, and a copy that is repeated anyway); a throttled conditional write
    would have happened after all, which AWS never does."""

    def __init__(self, operations: set[str], times: int) -> None:
        self.operations = operations
        self.times = times
        self.throttled: Counter[str] = Counter()

    def __call__(self, request: Any, **kwargs: Any) -> AWSResponse | None:
        event_name: str = kwargs["event_name"]  # before-send.<service>.<Operation>
        _, service, operation = event_name.split(".")
        name = f"{service}.{operation}"
        if name not in self.operations or self.throttled[name] >= self.times:
            return None
        self.throttled[name] += 1
        status, body = THROTTLED[service]
        return AWSResponse(request.url, status, {}, _Raw(body))


@pytest.fixture
def throttler(data_stack: OfflineStack) -> Iterator[Throttler]:
    throttle = Throttler({"dynamodb.GetItem", "s3.CopyObject", "s3.GetObject"}, times=2)
    assert boto3.DEFAULT_SESSION is not None
    boto3.DEFAULT_SESSION.events.register_first("before-send", throttle, unique_id="throttler")
    yield throttle
    boto3.DEFAULT_SESSION.events.unregister("before-send", unique_id="throttler")


def test_throttled_s3_and_dynamodb_calls_are_retried_and_nothing_is_lost(
    data_stack: OfflineStack, throttler: Throttler
) -> None:
    upload_pair(data_stack, "burst", "scene", scene(7))

    drain(data_stack)

    assert throttler.throttled == {"dynamodb.GetItem": 2, "s3.CopyObject": 2, "s3.GetObject": 2}
    intake = [i for i in data_stack.runtime.invocations if "Intake" in i.function]
    assert all(not i.failed for i in intake), "retries happen inside the call, not by SQS"
    assert set(status_by_key(data_stack).values()) == {"curated"}
    assert_every_upload_accounted_for_once(data_stack)
