"""The sweep, as logic: which batches close, which lone files are given up on, and when.

No stack: a ledger table with the template's key schema and a versioned bucket, under mock_aws,
and a clock the test sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from functions.data.models import FileStatus
from tests.integration.data_drops import scene
from tests.unit.intake_harness import UPLOADED, Harness, emulated_intake

QUIET = timedelta(minutes=15)
INCOMPLETE = timedelta(hours=1)


@pytest.fixture
def intake_at() -> Iterator[Harness]:
    """An Intake on a real (emulated) ledger and bucket, and the clock it reads."""
    with emulated_intake() as harness:
        yield harness


def _lone_image_arrives(at: Harness) -> None:
    event = at.upload("incoming/munich/images/street.jpg", scene(1).image)
    assert at.intake.process(event) is FileStatus.PENDING


def test_a_batch_still_receiving_files_stays_open(intake_at: Harness) -> None:
    _lone_image_arrives(intake_at)

    result = intake_at.intake.sweep(UPLOADED + QUIET / 2, quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert (result.closed, result.incomplete, result.reported) == ([], 0, [])


def test_a_quiet_batch_closes_but_its_lone_image_still_waits_for_its_label(
    intake_at: Harness,
) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + QUIET * 2

    result = intake_at.intake.sweep(intake_at.clock[0], quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert result.closed == ["munich"]
    assert result.incomplete == 0
    assert result.reported == ["munich"], "a closed batch gets its report"


def test_an_image_whose_label_never_came_is_given_up_on(intake_at: Harness) -> None:
    _lone_image_arrives(intake_at)
    intake_at.clock[0] = UPLOADED + INCOMPLETE * 2

    result = intake_at.intake.sweep(intake_at.clock[0], quiet_for=QUIET, incomplete_after=INCOMPLETE)

    assert (result.closed, result.incomplete) == (["munich"], 1)
    (record,) = [f for f in intake_at.intake.ledger.files("munich") if f.key.endswith("street.jpg")]
    assert record.status is FileStatus.QUARANTINED
    assert [r.code.value for r in record.reasons] == ["missing_label"]
