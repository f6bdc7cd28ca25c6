"""Intake: turn S3 notifications delivered through SQS into ledger entries.

This first version accounts for every object that lands (the ledger is how the system proves
nothing was dropped); validation and curation build on it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.data_classes import S3Event
from pydantic import ValidationError

from functions.common.errors import InvalidEventError
from functions.common.models import S3ObjectEvent, decode_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

TEST_EVENT = "s3:TestEvent"


def parse_notification(body: str) -> list[S3ObjectEvent]:
    """Objects named by one S3 notification message; none for S3's `s3:TestEvent`.

    Parsed leniently (Powertools' S3Event data class, not its strict model): moto's records lack
    fields that AWS sends, and neither may cost us an upload.
    """
    try:
        payload: dict[str, Any] = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidEventError(f"message body is not JSON: {body[:200]!r}") from exc
    if payload.get("Event") == TEST_EVENT:
        return []
    if not isinstance(payload.get("Records"), list):
        raise InvalidEventError(f"message has no S3 Records: {body[:200]!r}")
    try:
        return [
            S3ObjectEvent(
                bucket=record.s3.bucket.name,
                key=decode_key(record.s3.get_object.key),
                size=record.s3.get_object.get("size") or 0,
                etag=record.s3.get_object.get("eTag"),
                version_id=record.s3.get_object.get("versionId"),
                event_name=record.event_name,
                event_time=record.get("eventTime"),
            )
            for record in S3Event(payload).records
        ]
    except (KeyError, TypeError, ValidationError) as exc:
        raise InvalidEventError(f"S3 record lacks a required field: {exc}") from exc


class Ledger:
    """Where every uploaded object's fate is recorded (one item per object version)."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    def record_received(self, obj: S3ObjectEvent) -> None:
        # Keyed by object version: S3 delivers at least once, so a redelivered event rewrites
        # the same item instead of adding one.
        item = {
            "pk": {"S": f"object#{obj.key}"},
            "sk": {"S": f"version#{obj.version_id or obj.etag or 'null'}"},
            "bucket": {"S": obj.bucket},
            "key": {"S": obj.key},
            "size": {"N": str(obj.size)},
            "status": {"S": "received"},
            "event_name": {"S": obj.event_name},
            "recorded_at": {"S": datetime.now(UTC).isoformat()},
        }
        if obj.batch is not None:
            item["batch"] = {"S": obj.batch}
        if obj.etag:
            item["etag"] = {"S": obj.etag}
        if obj.version_id:
            item["version_id"] = {"S": obj.version_id}
        self._client.put_item(TableName=self._table, Item=item)
