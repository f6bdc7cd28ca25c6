"""The sweep, as logic: which batches close, which lone files are given up on, and when.

No stack: a ledger table with the template's key schema and a versioned bucket, under mock_aws,
and a clock the test sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import boto3
import pytest
from moto import mock_aws

from functions.common.models import S3ObjectEvent
from functions.data.ledger import Ledger
from functions.data.models import FileStatus
from functions.data.storage import DataBucket
from functions.intake.logic import Intake
from functions.validation import DEFAULT_CONFIG
from retrain.local.stack import DEFAULT_TEMPLATE
from retrain.local.template import load_template
from tests.integration.data_drops import scene

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET = "sweep-test-data"
UPLOADED = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
QUIET = timedelta(minutes=15)
INCOMPLETE = timedelta(hours=1)


@dataclass
class Sweeping:
    intake: Intake
    s3: S3Client
    clock: list[datetime]  # what the intake's clock reads: clock[0]


@pytest.fixture
def intake_at() -> Iterator[Sweeping]:
    """An Intake on a real (emulated) ledger and bucket, and the clock it reads."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        table = load_template(DEFAULT_TEMPLATE).resources["LedgerTable"]["Properties"]
        dynamodb.create_table(
            TableName="ledger",
            AttributeDefinitions=table["AttributeDefinitions"],
            KeySchema=table["KeySchema"],
            GlobalSecondaryIndexes=table["GlobalSecondaryIndexes"],
            BillingMode="PAY_PER_REQUEST",
        )
        clock = [UPLOADED]
        ledger, bucket = Ledger(dynamodb, "ledger"), DataBucket(s3, BUCKET)
        intake = Intake(ledger=ledger, bucket=bucket, config=DEFAULT_CONFIG, clock=lambda: clock[0])
        yield Sweeping(intake, s3, clock)


def _lone_image_arrives(at: Sweeping) -> None:
    key = "incoming/munich/images/street.jpg"
    version = at.s3.put_object(Bucket=BUCKET, Key=key, Body=scene(1).image)["VersionId"]
    event = S3ObjectEvent(bucket=BUCKET, key=key, size=1, version_id=version, event_name="ObjectCreated:Put")
    assert at.intake.process(event) is FileStatus.PENDING


def test_a_batch_still_receiving_files_stays_open(intake_at: Sweeping) -> None:
    _lone_image_arrives(intake_at)

    result = intake_at.intake.sweep(UPLOADED + QUIET / 2, quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert (result.closed, result.incomplete, result.reported) == ([], 0, [])


def test_a_quiet_batch_closes_but_its_lone_image_still_waits_for_its_label(
    intake_at: Sweeping,
) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + QUIET * 2

    result = intake_at.intake.sweep(intake_at.clock[0], quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert result.closed == ["munich"]
    assert result.incomplete == 0
    assert result.reported == ["munich"], "a closed batch gets its report"


def test_an_image_whose_label_never_came_is_given_up_on(intake_at: Sweeping) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + INCOMPLETE * 2

    result = intake_at.intake.sweep(intake_at.clock[0], quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert (result.closed, result.incomplete) == (["munich"], 1)
    (record,) = [f for f in intake_at.intake.ledger.files("munich") if f.key.endswith("street.jpg")]
    assert record.status is FileStatus.QUARANTINED
    assert [r.code.value for r in record.reasons] == ["missing_label"]
