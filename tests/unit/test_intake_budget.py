"""How much of an invocation the intake keeps back before it stops starting records, and in what
order a batch's records are started."""

from __future__ import annotations

import pytest

from functions.common.errors import IntakeOutOfTimeError
from functions.intake.budget import TimeBudget, in_delivery_order, on_last_try


@pytest.mark.parametrize(
    ("timeout_ms", "decode_limit_ms", "margin_ms"),
    [
        (60_000, 10_000, 15_000),
        (900_000, 10_000, 15_000),
        (60_000, 2_000, 7_000),
        (30_000, 10_000, 7_500),
        (1_000, 1_000, 250),
    ],
    ids=["the template's 60 s", "Lambda's longest", "a 2 s limit", "the data tests' 30 s", "the queue tests' 1 s"],
)
def test_the_margin_is_the_decode_limit_and_five_seconds_or_a_quarter_of_a_short_invocation(
    timeout_ms: int, decode_limit_ms: int, margin_ms: int
) -> None:
    budget = TimeBudget.of(lambda: timeout_ms, decode_limit_ms)

    assert budget.margin_ms == margin_ms
    budget.check()  # the first record always starts


def test_below_the_margin_a_record_is_not_started_and_the_error_says_why() -> None:
    left = [60_000]
    budget = TimeBudget.of(lambda: left[0])
    left[0] = 14_999

    with pytest.raises(IntakeOutOfTimeError, match="14999 ms of the invocation left, less than the 15000 ms"):
        budget.check()


def test_a_margin_is_kept_for_each_record_on_its_last_try_waiting_after_it() -> None:
    left = [60_000]
    budget = TimeBudget.of(lambda: left[0])
    left[0] = 40_000

    budget.check(kept_for=1)  # 30 s: this record's margin and one for the last try after it
    with pytest.raises(IntakeOutOfTimeError, match="less than the 45000 ms kept for a record and 2 records on their"):
        budget.check(kept_for=2)


def record(name: str, count: str | None) -> dict[str, object]:
    return {"messageId": name, "attributes": {} if count is None else {"ApproximateReceiveCount": count}}


def test_first_deliveries_come_first_and_records_delivered_again_after_them_least_delivered_first() -> None:
    event = {"Records": [record("a", "1"), record("b", "3"), record("c", None), record("d", "2"), record("e", "3")]}

    assert [r["messageId"] for r in in_delivery_order(event)["Records"]] == ["a", "c", "d", "b", "e"]


def test_a_record_delivered_max_receive_count_times_is_on_its_last_try() -> None:
    assert [on_last_try(record("x", count), 5) for count in ("1", "4", "5", "6", None)] == [
        False,
        False,
        True,
        True,
        False,
    ]
