"""An erasure request for a pair on its team's relabel list (`retrain data purge`, issue 34): the
picture beside the batch report shows the image, so it is erased with the pair, and the pair leaves
the list; the other pairs' pictures stay. On moto's S3 and DynamoDB, with the template's table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.data.ledger import Ledger
from functions.data.models import Trust
from retrain.local.cloudformation.stack import create_ledger_table
from retrain.ops.purge import purge
from tests.unit.trust_stories import curate, screened

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
RUN = "ds-20270228T090000Z-4f2a"
FIX = "reports/batches/munich-12/fix/"


@pytest.fixture
def aws() -> Iterator[tuple[Ledger, Any]]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        yield Ledger(dynamodb, "ledger"), s3


def pictures(s3: Any) -> list[str]:
    """Every version under the relabel list's folder, by key."""
    listed = s3.list_object_versions(Bucket="data", Prefix=FIX)
    return sorted(item["Key"] for kind in ("Versions", "DeleteMarkers") for item in listed.get(kind, []))


@pytest.fixture
def listed(aws: tuple[Ledger, Any]) -> dict[str, str]:
    """munich-12's worst two pairs on its relabel list (fix/1.png, fix/2.png), and an older run's
    picture (fix/3.png) that no list names any more."""
    ledger, s3 = aws
    contents = curate(ledger, "munich-12", ["face-0", "street-1", "street-2"], at=NOW - timedelta(days=2))
    to_fix = {"face-0": contents["face-0"], "street-1": contents["street-1"]}
    screened(ledger, "munich-12", dict.fromkeys(to_fix.values(), Trust.HELD), run=RUN, at=NOW, to_fix=to_fix)
    for number in (1, 2, 3):
        s3.put_object(Bucket="data", Key=f"{FIX}{number}.png", Body=b"a picture of the pair")
    return contents


def test_an_erased_pair_leaves_the_relabel_list_with_its_picture(
    aws: tuple[Ledger, Any], listed: dict[str, str]
) -> None:
    ledger, s3 = aws

    report = purge(ledger, s3, "data", ["munich-12/face-0"], clock=lambda: NOW)

    assert report.remaining == [] and report.unmatched == [], report
    assert pictures(s3) == [f"{FIX}2.png"], "the erased pair's picture (or a stale one) is still there"
    trust = ledger.trust("munich-12")
    assert trust is not None
    assert [p.image for p in trust.to_fix] == ["images/munich-12/street-1.jpg"], "the erased pair is still listed"
    assert trust.of(listed["street-1"]) is Trust.HELD, "a neighbour's verdict changed"
    assert f"{FIX}1.png" in {o.key for o in report.objects}, "the purge does not say it erased the picture"


def test_a_dry_run_names_the_picture_and_changes_nothing(aws: tuple[Ledger, Any], listed: dict[str, str]) -> None:
    ledger, s3 = aws
    before = ledger.trust("munich-12")

    report = purge(ledger, s3, "data", ["munich-12/face-0"], dry_run=True, clock=lambda: NOW)

    assert {f"{FIX}1.png", f"{FIX}3.png"} <= {o.key for o in report.objects}
    assert pictures(s3) == [f"{FIX}1.png", f"{FIX}2.png", f"{FIX}3.png"]
    assert ledger.trust("munich-12") == before, "a dry run changed the relabel list"
