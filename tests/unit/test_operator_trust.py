"""An operator decides which batches' labels are trained on (`retrain/ops/trust.py`): what each
decision does to a batch's trust record, and which it refuses, on an emulated ledger (no stack)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, LockRecord, PairRecord, PairStatus, Trust, TrustRecord
from retrain.local.cloudformation.stack import create_ledger_table
from retrain.ops.trust import (
    TrustRefusedError,
    hold_batch,
    make_benchmark,
    release_batch,
    trust_overview,
    undo_benchmark,
)

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
SCREENED = NOW - timedelta(days=1)
RUN = "ds-20270228T090000Z-4f2a"


def clock() -> datetime:
    return NOW


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        yield Ledger(dynamodb, "ledger")


def a_batch(ledger: Ledger, name: str, *, curated: int = 0) -> None:
    """A batch the intake has seen, with `curated` valid pairs."""
    ledger.touch_batch(name, NOW - timedelta(days=2))
    for index in range(curated):
        ledger.put_pair(
            PairRecord(batch=name, stem=f"scene-{index}", status=PairStatus.VALID, first_seen=NOW - timedelta(days=2)),
            1,
        )


def held_by_screening(ledger: Ledger, name: str, *reasons: str) -> None:
    a_batch(ledger, name, curated=3)
    assert ledger.hold(
        TrustRecord(batch=name, trust=Trust.HELD, reasons=list(reasons), run=RUN, by="screening", at=SCREENED)
    )


def test_a_batch_held_by_screening_is_released_with_the_operators_reason_beside_the_runs(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12", "likely label errors on 41 % of pixels (trusted pairs: 6 %)")

    change = release_batch(ledger, "munich-12", reason="checked by hand: the labels are right", clock=clock)

    assert (change.before, change.after) == ("held", "released")
    record = ledger.trust("munich-12")
    assert record is not None and record.trust is Trust.RELEASED
    assert (record.by, record.run, record.at) == ("operator", RUN, NOW), record
    assert record.reasons == [
        "checked by hand: the labels are right",
        "held: likely label errors on 41 % of pixels (trusted pairs: 6 %)",
    ]
    assert not ledger.hold(record.model_copy(update={"trust": Trust.HELD, "by": "screening"})), (
        "screening held a batch an operator released"
    )


def frozen_and_consumed(ledger: Ledger, name: str, version: str) -> None:
    """What the trigger does to a batch when a run's version takes it in: every curated pair is
    marked with the version, and the batch leaves the closed list."""
    for pair in ledger.pairs(name):
        found = ledger.pair(name, pair.stem)
        assert found is not None
        ledger.put_pair(found[0].model_copy(update={"dataset_version": version}), found[1] + 1)
    found_batch = ledger.batch(name)
    assert found_batch is not None
    record, revision = found_batch
    ledger.close_batch(record.model_copy(update={"status": BatchStatus.CLOSED}), revision)
    closed = {batch.batch: (batch, rev) for batch, rev in ledger.closed_batches()}
    assert ledger.consume_batch(*closed[name])


def test_a_released_batch_the_screening_run_had_frozen_is_new_data_for_the_trigger_again(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12", "likely label errors")
    frozen_and_consumed(ledger, "munich-12", RUN)
    assert "munich-12" not in {batch.batch for batch, _ in ledger.closed_batches()}

    change = release_batch(ledger, "munich-12", clock=clock)

    assert change.offered == 3
    assert [pair.dataset_version for pair in ledger.pairs("munich-12")] == [None, None, None]
    (closed,) = [batch for batch, _ in ledger.closed_batches() if batch.batch == "munich-12"]
    assert closed.last_seen == NOW, "back among the closed batches, settling from the release on"


def test_a_release_reads_again_a_pair_the_intake_changed_under_it(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_by_screening(ledger, "munich-12", "likely label errors")
    frozen_and_consumed(ledger, "munich-12", RUN)
    original = ledger.put_pair
    raced: list[str] = []

    def intake_writes_first(record: PairRecord, revision: int) -> None:
        if not raced:  # a corrected label lands between the release's read and its write
            raced.append(record.stem)
            found = ledger.pair(record.batch, record.stem)
            assert found is not None
            original(found[0].model_copy(update={"label_destination_version": "v2"}), found[1] + 1)
        original(record, revision)

    monkeypatch.setattr(ledger, "put_pair", intake_writes_first)

    release_batch(ledger, "munich-12", clock=clock)

    assert [pair.dataset_version for pair in ledger.pairs("munich-12")] == [None, None, None]
    (changed,) = [pair for pair in ledger.pairs("munich-12") if pair.stem == raced[0]]
    assert changed.label_destination_version == "v2", "the intake's write is kept"


@pytest.mark.parametrize(
    ("trust", "said"),
    [(None, "it is new"), (Trust.TRUSTED, "it is trusted"), (Trust.BENCHMARK, "it is benchmark")],
)
def test_a_batch_that_is_not_held_is_not_released_and_the_refusal_says_what_it_is(
    ledger: Ledger, trust: Trust | None, said: str
) -> None:
    a_batch(ledger, "berlin-3")
    if trust is not None:
        ledger.set_trust(TrustRecord(batch="berlin-3", trust=trust, by="the gate", at=SCREENED))
    before = ledger.trust("berlin-3")

    with pytest.raises(TrustRefusedError, match=f"berlin-3 is not held: {said}"):
        release_batch(ledger, "berlin-3", clock=clock)

    assert ledger.trust("berlin-3") == before, "a refused release changed the batch's trust"


def test_a_batch_the_ledger_does_not_know_is_refused_by_every_decision(ledger: Ledger) -> None:
    for decide in (release_batch, hold_batch, make_benchmark, undo_benchmark):
        with pytest.raises(TrustRefusedError, match="there is no batch no-such-drop in the ledger"):
            decide(ledger, "no-such-drop")
    assert ledger.trusts() == {}, "a refused decision wrote a trust record"


def test_an_operator_holds_a_trusted_batch_and_is_told_which_run_still_uses_it(ledger: Ledger) -> None:
    a_batch(ledger, "koeln", curated=2)
    ledger.set_trust(TrustRecord(batch="koeln", trust=Trust.TRUSTED, run=RUN, by="the gate", at=SCREENED))
    ledger.acquire_lock(
        LockRecord(holder=RUN, acquired_at=SCREENED, expires_at=NOW + timedelta(hours=1)), replacing=None
    )

    change = hold_batch(ledger, "koeln", reason="a customer complaint about the bus labels", clock=clock)

    assert (change.before, change.after, change.running) == ("trusted", "held", RUN)
    record = ledger.trust("koeln")
    assert record is not None
    assert (record.trust, record.by, record.run, record.reasons) == (
        Trust.HELD,
        "operator",
        None,
        ["a customer complaint about the bus labels"],
    )


def test_a_purges_lease_on_the_lock_is_no_run_that_still_uses_a_held_batch(ledger: Ledger) -> None:
    a_batch(ledger, "koeln")
    ledger.acquire_lock(
        LockRecord(holder="purge:20270301-085959-ab12", acquired_at=NOW, expires_at=NOW + timedelta(minutes=5)),
        replacing=None,
    )

    assert hold_batch(ledger, "koeln", clock=clock).running is None


def test_a_held_batch_or_a_benchmark_is_not_held_again(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12", "class map swapped: road labelled as sidewalk")
    a_batch(ledger, "eval-2026")
    make_benchmark(ledger, "eval-2026", clock=clock)

    with pytest.raises(TrustRefusedError, match=f"munich-12 is held already \\(by run {RUN}'s screening"):
        hold_batch(ledger, "munich-12", clock=clock)
    with pytest.raises(TrustRefusedError, match=r"eval-2026 is the team's benchmark.*--undo"):
        hold_batch(ledger, "eval-2026", clock=clock)

    held = ledger.trust("munich-12")
    assert held is not None and held.by == "screening", "the screening's record was overwritten"


def test_a_benchmark_batch_is_named_refused_while_held_and_turned_back_into_a_new_batch(ledger: Ledger) -> None:
    a_batch(ledger, "eval-2026", curated=5)
    held_by_screening(ledger, "munich-12")

    named = make_benchmark(ledger, "eval-2026", clock=clock)

    assert (named.before, named.after) == ("new", "benchmark")
    with pytest.raises(TrustRefusedError, match="eval-2026 is the team's benchmark already"):
        make_benchmark(ledger, "eval-2026", clock=clock)
    with pytest.raises(TrustRefusedError, match=r"munich-12 is held.*retrain data release munich-12"):
        make_benchmark(ledger, "munich-12", clock=clock)
    with pytest.raises(TrustRefusedError, match="munich-12 is not the team's benchmark: it is held"):
        undo_benchmark(ledger, "munich-12")

    undone = undo_benchmark(ledger, "eval-2026")

    assert (undone.before, undone.after, undone.record) == ("benchmark", "new", None)
    assert ledger.trust("eval-2026") is None, "the benchmark's trust record is still there"


def test_the_overview_lists_held_released_and_benchmark_batches_and_counts_the_others(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12", "class map swapped")
    held_by_screening(ledger, "night-drive")
    release_batch(ledger, "night-drive", reason="night scenes are new to the model", clock=clock)
    a_batch(ledger, "koeln")
    hold_batch(ledger, "koeln", reason="a customer complaint", clock=clock)
    a_batch(ledger, "eval-2026", curated=2)
    make_benchmark(ledger, "eval-2026", clock=clock)
    a_batch(ledger, "aachen")
    ledger.set_trust(TrustRecord(batch="aachen", trust=Trust.TRUSTED, run=RUN, by="the gate", at=SCREENED))
    a_batch(ledger, "bonn")

    overview = trust_overview(ledger, clock=clock)

    assert [(e.batch, e.by, e.run, e.pairs) for e in overview.held] == [
        ("munich-12", "screening", RUN, 3),
        ("koeln", "operator", None, 0),
    ], "held batches, oldest decision first, with who held them"
    assert overview.held[0].reasons == ["class map swapped"]
    assert overview.held[0].run_report == f"reports/runs/{RUN}/"
    assert [e.batch for e in overview.released] == ["night-drive"]
    assert [(e.batch, e.pairs) for e in overview.benchmark] == [("eval-2026", 2)]
    assert (overview.trusted, overview.new) == (1, 1), "aachen is trusted, bonn is new"


def test_the_overview_of_a_ledger_with_no_trust_records_is_empty(ledger: Ledger) -> None:
    a_batch(ledger, "bonn")

    overview = trust_overview(ledger, clock=clock)

    assert (overview.held, overview.released, overview.benchmark) == ([], [], [])
    assert (overview.trusted, overview.new) == (0, 1)
