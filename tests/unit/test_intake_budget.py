"""How much of an invocation the intake keeps back before it stops starting records."""

from __future__ import annotations

import pytest

from functions.common.errors import IntakeOutOfTimeError
from functions.intake.budget import TimeBudget, most_delivered_first


@pytest.mark.parametrize(
    ("timeout_ms", "margin_ms"),
    [(60_000, 10_000), (900_000, 10_000), (30_000, 7_500), (1_000, 250)],
    ids=["the template's 60 s", "Lambda's longest", "the data tests' 30 s", "the queue tests' 1 s"],
)
def test_the_margin_is_ten_seconds_or_a_quarter_of_a_short_invocation(timeout_ms: int, margin_ms: int) -> None:
    budget = TimeBudget.of(lambda: timeout_ms)

    assert budget.margin_ms == margin_ms
    budget.check()  # the first record always starts


def test_below_the_margin_a_record_is_not_started_and_the_error_says_why() -> None:
    left = [60_000]
    budget = TimeBudget.of(lambda: left[0])
    left[0] = 9_999

    with pytest.raises(IntakeOutOfTimeError, match="9999 ms of the invocation left, less than the 10000 ms"):
        budget.check()


def test_records_delivered_most_often_come_first_in_sqs_order_among_equals() -> None:
    def record(name: str, count: str | None) -> dict[str, object]:
        return {"messageId": name, "attributes": {} if count is None else {"ApproximateReceiveCount": count}}

    event = {"Records": [record("a", "1"), record("b", "3"), record("c", None), record("d", "2"), record("e", "3")]}

    assert [r["messageId"] for r in most_delivered_first(event)["Records"]] == ["b", "e", "d", "a", "c"]
