"""What a run does to batches' trust (functions/evaluate_run/trust.py): its screening holds,
its acceptance trusts, and an operator's release stands (issue 26). On moto's DynamoDB, with the
template's table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.data.ledger import Ledger
from functions.data.models import Trust, TrustRecord
from functions.data.storage import DataBucket
from functions.evaluate_run.trust import ScreenedBatch, ScreeningFile, TrustKeeper
from retrain.local.cloudformation.stack import create_ledger_table

NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)
BUCKET, TABLE = "data", "ledger"


@pytest.fixture
def aws() -> Iterator[tuple[TrustKeeper, Any]]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, TABLE)
        yield TrustKeeper(Ledger(dynamodb, TABLE), DataBucket(s3, BUCKET)), s3


def _screening(*held: str) -> ScreeningFile:
    batches = {
        name: ScreenedBatch(
            trust="new", pairs=10, share=0.7 if name in held else 0.1, held=name in held, reasons=[f"{name}: why"]
        )
        for name in ("team-a", "team-b", "team-c")
    }
    return ScreeningFile(model="m", calibration="trusted pairs", held=list(held), batches=batches)


def test_a_held_batch_is_recorded_with_its_reasons_and_its_report_says_so(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, s3 = aws
    changes = keeper.record("run-1", _screening("team-b"), accepted=False, trained=["team-a", "team-c"], now=NOW)

    assert changes.held == {"team-b": ["team-b: why"]} and changes.trusted == []
    record = keeper.ledger.trust("team-b")
    assert record is not None and (record.trust, record.run, record.by) == (Trust.HELD, "run-1", "screening")
    report = keeper.bucket.get_json("reports/batches/team-b/report.json")
    assert report["trust"]["trust"] == "held" and report["trust"]["reasons"] == ["team-b: why"]
    markdown = s3.get_object(Bucket=BUCKET, Key="reports/batches/team-b/report.md")["Body"].read().decode()
    assert "## Held: left out of training" in markdown and "retrain data release team-b" in markdown


def test_an_accepted_run_trusts_the_batches_it_trained_on_but_not_the_held_one(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    changes = keeper.record("run-1", _screening("team-b"), accepted=True, trained=["team-a", "team-c"], now=NOW)

    assert changes.trusted == ["team-a", "team-c"]
    assert {name: record.trust for name, record in keeper.ledger.trusts().items()} == {
        "team-a": Trust.TRUSTED,
        "team-b": Trust.HELD,
        "team-c": Trust.TRUSTED,
    }


def test_an_operators_release_stands_against_the_next_screening(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    keeper.ledger.set_trust(TrustRecord(batch="team-b", trust=Trust.RELEASED, by="operator", at=NOW))

    changes = keeper.record("run-2", _screening("team-b"), accepted=True, trained=["team-a", "team-b"], now=NOW)

    assert changes.held == {}, "a released batch is not held again automatically"
    record = keeper.ledger.trust("team-b")
    assert record is not None and record.trust is Trust.RELEASED, "nor made trusted behind the operator's back"
    assert changes.trusted == ["team-a"]


def test_a_retry_changes_nothing_twice(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    first = keeper.record("run-1", _screening("team-b"), accepted=True, trained=["team-a"], now=NOW)
    again = keeper.record("run-1", _screening("team-b"), accepted=True, trained=["team-a"], now=NOW)

    assert first.trusted == ["team-a"] and again.trusted == []
    assert again.held == {"team-b": ["team-b: why"]}, "holding again is the same hold"
    assert len(keeper.ledger.trusts()) == 2
