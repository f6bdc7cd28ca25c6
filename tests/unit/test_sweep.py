"""The sweep, as logic: which batches close, which lone files are given up on, and when, and
that the trigger is asked to look once batches closed.

No stack: a ledger table with the template's key schema and a versioned bucket, under mock_aws,
and a clock the test sets; the intake and the sweeper share them, as the deployed functions do.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

from functions.data.models import FileStatus
from functions.sweeper.logic import Sweeper
from tests.integration.data_drops import scene
from tests.unit.intake_harness import UPLOADED, Harness, emulated_intake

QUIET = timedelta(minutes=15)
INCOMPLETE = timedelta(hours=1)


@pytest.fixture
def intake_at() -> Iterator[Harness]:
    """An Intake on a real (emulated) ledger and bucket, and the clock it reads."""
    with emulated_intake() as harness:
        yield harness


def _sweeper(at: Harness, kicks: list[str] | None = None) -> Sweeper:
    """A sweeper on the intake's ledger and bucket, reading the same clock."""
    return Sweeper(
        ledger=at.intake.ledger,
        bucket=at.intake.bucket,
        clock=lambda: at.clock[0],
        quiet_for=QUIET,
        incomplete_after=INCOMPLETE,
        kick=(kicks if kicks is not None else []).append,
    )


def _lone_image_arrives(at: Harness) -> None:
    event = at.upload("incoming/munich/images/street.jpg", scene(1).image)
    assert at.intake.process(event) is FileStatus.PENDING


def test_a_batch_still_receiving_files_stays_open(intake_at: Harness) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + QUIET / 2
    kicks: list[str] = []

    result = _sweeper(intake_at, kicks).sweep()

    assert (result.closed, result.incomplete, result.reported) == ([], 0, [])
    assert kicks == [], "nothing closed: the trigger is not bothered"


def test_a_quiet_batch_closes_but_its_lone_image_still_waits_for_its_label(
    intake_at: Harness,
) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + QUIET * 2
    kicks: list[str] = []

    result = _sweeper(intake_at, kicks).sweep()

    assert result.closed == ["munich"]
    assert result.incomplete == 0
    assert result.reported == ["munich"], "a closed batch gets its report"
    assert kicks == ["quiet batches closed"], "the trigger is asked to look"


def test_an_image_whose_label_never_came_is_given_up_on(intake_at: Harness) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + INCOMPLETE * 2

    result = _sweeper(intake_at).sweep()

    assert (result.closed, result.incomplete) == (["munich"], 1)
    (record,) = [f for f in intake_at.intake.ledger.files("munich") if f.key.endswith("street.jpg")]
    assert record.status is FileStatus.QUARANTINED
    assert [r.code.value for r in record.reasons] == ["missing_label"]


def test_a_batch_closed_by_its_marker_is_reported_and_the_trigger_asked_to_look(intake_at: Harness) -> None:
    _lone_image_arrives(intake_at)
    kicks: list[str] = []
    intake_at.intake.kick = kicks.append

    assert intake_at.intake.process(intake_at.upload("incoming/munich/_COMPLETE", b"")) is FileStatus.MARKER
    intake_at.intake.finish()

    assert kicks == ["batch closed"]
    assert "reports/batches/munich/report.json" in [key for key, _ in intake_at.versions("reports/")]


def test_pairs_curated_after_their_marker_closed_the_batch_ask_the_trigger_to_look_again(intake_at: Harness) -> None:
    # S3 and SQS keep no order: the marker, uploaded last, is processed first, in one invocation,
    # and the pair in the next. Without a second look it would wait for the trigger's schedule.
    kicks: list[str] = []
    intake_at.intake.kick = kicks.append
    assert intake_at.intake.process(intake_at.upload("incoming/munich/_COMPLETE", b"")) is FileStatus.MARKER
    intake_at.intake.finish()
    pair = scene(1)

    later = dataclasses.replace(intake_at.intake, touched=set(), newly_closed=set(), grown=set())
    later.process(intake_at.upload("incoming/munich/images/street.jpg", pair.image))
    later.process(intake_at.upload("incoming/munich/labels/street.png", pair.label))
    later.finish()

    assert kicks == ["batch closed", "pairs curated after their batch closed"]
    report = json.loads(intake_at.body("reports/batches/munich/report.json"))
    assert len(report["accepted"]) == 1


def test_objects_of_an_open_batch_ask_the_trigger_nothing(intake_at: Harness) -> None:
    kicks: list[str] = []
    intake_at.intake.kick = kicks.append
    pair = scene(1)
    intake_at.intake.process(intake_at.upload("incoming/munich/images/street.jpg", pair.image))
    intake_at.intake.process(intake_at.upload("incoming/munich/labels/street.png", pair.label))
    intake_at.intake.finish()

    assert kicks == []


def test_a_batch_named_runs_is_reported_among_the_batches_never_among_the_runs_evidence(intake_at: Harness) -> None:
    event = intake_at.upload("incoming/runs/images/street.jpg", scene(1).image)
    assert intake_at.intake.process(event) is FileStatus.PENDING

    assert intake_at.intake.process(intake_at.upload("incoming/runs/_COMPLETE", b"")) is FileStatus.MARKER
    intake_at.intake.finish()

    written = [key for key, _ in intake_at.versions("reports/")]
    assert "reports/batches/runs/report.json" in written
    assert not [key for key in written if key.startswith("reports/runs/")], "only EvaluateRun writes there"
