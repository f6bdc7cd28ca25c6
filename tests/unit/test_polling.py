"""How often a run looks at a slow thing, and why it stays far below the 25,000-event history limit."""

from __future__ import annotations

from functions.common.polling import MAX_LOOKS, cap_for, next_wait

EVENTS_PER_LOOK = 9  # Wait (2), Task (5), Choice (2)


def looks_until(seconds: int, first: int, cap: int) -> int:
    elapsed = looks = 0
    while elapsed < seconds:
        elapsed += next_wait(first, looks, cap)
        looks += 1
    return looks


def test_waits_double_from_the_first_up_to_the_cap() -> None:
    assert [next_wait(60, looks, 300) for looks in range(5)] == [60, 120, 240, 300, 300]


def test_a_first_wait_of_zero_stays_zero_for_tests() -> None:
    assert {next_wait(0, looks, 300) for looks in range(10)} == {0}


def test_a_day_long_job_is_looked_at_a_few_hundred_times() -> None:
    looks = looks_until(86_400, first=60, cap=cap_for(86_400))

    assert looks < 300
    assert looks * EVENTS_PER_LOOK < 3_000


def test_even_a_28_day_job_stays_far_below_the_history_limit() -> None:
    runtime = 28 * 24 * 3600
    looks = looks_until(runtime, first=60, cap=cap_for(runtime))

    assert cap_for(runtime) > 300, "the cap rises with the runtime"
    assert looks <= MAX_LOOKS + 5
    assert looks * EVENTS_PER_LOOK < 10_000 < 25_000
