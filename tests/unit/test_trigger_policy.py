"""When does new data start a retraining? The policy alone, without AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.common.errors import InvalidEventError
from functions.common.requests import TriggerInput
from functions.data.models import BatchRecord, BatchStatus, PairRecord
from functions.trigger.logic import TriggerPolicy, decide

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
POLICY = TriggerPolicy(min_new_pairs=3, max_delay_seconds=3600)


def closed(batch: str, minutes_ago: int) -> BatchRecord:
    moment = NOW - timedelta(minutes=minutes_ago)
    return BatchRecord(
        batch=batch,
        status=BatchStatus.CLOSED,
        first_seen=moment,
        last_seen=moment,
        closed_at=moment,
    )


def pairs(batch: str, count: int) -> list[PairRecord]:
    return [PairRecord(batch=batch, stem=f"{batch}-{i}", first_seen=NOW) for i in range(count)]


def test_nothing_new_starts_nothing() -> None:
    decision = decide([], {}, NOW, POLICY)

    assert not decision.start
    assert decision.reason == "no new curated pairs in closed batches"


def test_enough_new_pairs_start_a_run_at_once() -> None:
    batches = {"b1": closed("b1", 1), "b2": closed("b2", 2)}

    decision = decide(pairs("b1", 2) + pairs("b2", 1), batches, NOW, POLICY)

    assert decision.start and decision.new_pairs == 3
    assert decision.reason == "3 new pairs (threshold 3)"


def test_a_few_pairs_wait_until_the_oldest_has_waited_the_delay() -> None:
    fresh = decide(pairs("b1", 1), {"b1": closed("b1", 59)}, NOW, POLICY)
    stale = decide(pairs("b1", 1), {"b1": closed("b1", 60)}, NOW, POLICY)

    assert not fresh.start and "below 3" in fresh.reason
    assert stale.start and "waiting 3600 s" in stale.reason


def test_the_delay_counts_from_the_oldest_batch() -> None:
    batches = {"old": closed("old", 90), "new": closed("new", 1)}

    decision = decide(pairs("new", 1) + pairs("old", 1), batches, NOW, POLICY)

    assert decision.start, decision.reason


def test_a_person_s_request_waives_the_count_and_the_delay_but_not_the_need_for_new_pairs() -> None:
    batches = {"b1": closed("b1", 1)}

    asked = decide(pairs("b1", 1), batches, NOW, POLICY, requested_by="ana")
    nothing = decide([], batches, NOW, POLICY, requested_by="ana")

    assert asked.start and asked.new_pairs == 1
    assert asked.reason == "1 new pairs, started on request by ana"
    assert not nothing.start and nothing.reason == "no new curated pairs in closed batches"


def test_a_start_request_parses_and_only_the_start_action_is_a_request() -> None:
    start = TriggerInput.parse({"action": "start", "source": "retrain runs start (ana)"})
    look = TriggerInput.parse({"source": "aws.events", "detail-type": "Scheduled Event"})

    assert start.action == "start" and look.action == "look"
    with pytest.raises(InvalidEventError, match="schedule, kick or start"):
        TriggerInput.parse({"action": "begin"})
