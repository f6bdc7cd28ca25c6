"""A person decides which pairs' labels are trained on (`retrain/ops/trust.py`, issue 34): each
decision names who made it and why, changes the verdicts on a batch's current pair contents only,
and is refused, with nothing changed, where it does not apply. On an emulated ledger (no stack);
the last tests run `retrain data release` itself, as an operator who assumed a role."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from functions.data.ledger import Ledger
from functions.data.models import LockRecord, Trust
from retrain.cli import app
from retrain.local.cloudformation.stack import create_ledger_table
from retrain.ops.trust import (
    CHECKED_BY_HAND,
    SCREENED_AND_TRUSTED,
    UNDONE,
    ReasonRequiredError,
    TrustChange,
    TrustRefusedError,
    caller_identity,
    hold_batch,
    make_benchmark,
    release_batch,
    trust_overview,
    undo_benchmark,
)
from tests.unit.trust_stories import curate, freeze, relabel, screened

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
SCREENED = NOW - timedelta(days=1)
UPLOADED = NOW - timedelta(days=2)
RUN = "ds-20270228T090000Z-4f2a"
ALICE = "arn:aws:sts::123456789012:assumed-role/retrain-TrustOperatorRole-1A2B/alice"
SWAPPED = "likely label errors on 41 % of pixels (trusted pairs: 6 %)"
STEMS = ["scene-0", "scene-1", "scene-2"]


def clock() -> datetime:
    return NOW


def held_by_screening(ledger: Ledger, batch: str, stems: list[str] = STEMS) -> dict[str, str]:
    """A drop whose every pair a run's screening held, each on the team's relabel list."""
    contents = curate(ledger, batch, stems, at=UPLOADED)
    screened(
        ledger,
        batch,
        dict.fromkeys(contents.values(), Trust.HELD),
        run=RUN,
        at=SCREENED,
        reasons=(SWAPPED,),
        to_fix=contents,
    )
    return contents


def trusted_by_screening(ledger: Ledger, batch: str, stems: list[str] = STEMS) -> dict[str, str]:
    contents = curate(ledger, batch, stems, at=UPLOADED)
    screened(ledger, batch, dict.fromkeys(contents.values(), Trust.TRUSTED), run=RUN, at=SCREENED)
    return contents


def verdicts(ledger: Ledger, batch: str) -> dict[str, Trust]:
    found = ledger.trust(batch)
    return dict(found.pairs) if found else {}


class UntouchedLedger:
    """A ledger nobody may look at: a refusal that reads or writes fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the ledger was asked for {name} before the reason was checked")


DECISIONS: dict[str, Callable[..., TrustChange]] = {
    "release": release_batch,
    "hold": hold_batch,
    "benchmark": make_benchmark,
    "undo": undo_benchmark,
}


# ------------------------------------------------------------- who and why --
@pytest.mark.parametrize("reason", ["", "   "], ids=["empty", "blank"])
@pytest.mark.parametrize("decision", DECISIONS)
def test_a_decision_without_a_reason_is_refused_before_the_ledger_is_read(decision: str, reason: str) -> None:
    with pytest.raises(ReasonRequiredError, match="needs a reason"):
        DECISIONS[decision](cast(Ledger, UntouchedLedger()), "munich-12", reason=reason, by=ALICE, clock=clock)


def test_a_release_without_a_reason_changes_nothing(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")
    before = ledger.trust("munich-12")

    with pytest.raises(ReasonRequiredError):
        release_batch(ledger, "munich-12", reason=" ", by=ALICE, clock=clock)

    assert ledger.trust("munich-12") == before, "a release without a reason changed the batch's trust"


def test_a_decision_by_nobody_is_refused(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")

    with pytest.raises(ReasonRequiredError, match="identity"):
        release_batch(ledger, "munich-12", reason="checked by hand", by="", clock=clock)


def test_the_callers_identity_is_what_sts_says_they_are() -> None:
    with mock_aws():
        sts = boto3.client("sts", region_name="us-east-1")

        assert caller_identity(sts) == sts.get_caller_identity()["Arn"]
        assert caller_identity(sts).startswith("arn:aws:sts::"), "an ARN, not a name a person types"


# ----------------------------------------------------------------- release --
def test_pairs_held_by_screening_are_released_by_a_named_person_with_their_reason(ledger: Ledger) -> None:
    contents = held_by_screening(ledger, "munich-12")

    change = release_batch(ledger, "munich-12", reason="checked by hand: the labels are right", by=ALICE, clock=clock)

    assert verdicts(ledger, "munich-12") == dict.fromkeys(contents.values(), Trust.RELEASED)
    assert (change.before.held, change.after.released) == (3, 3), change
    decision = change.decision
    assert (decision.verdict, decision.by, decision.run, decision.at, decision.pairs) == (
        "released",
        ALICE,
        None,
        NOW,
        3,
    )
    assert decision.reasons == ["checked by hand: the labels are right"]
    record = ledger.trust("munich-12")
    assert record is not None
    assert [d.by for d in record.decisions] == [f"run {RUN}'s screening", ALICE], "the screening's decision is kept"
    assert record.to_fix == [], "released pairs are right: they left the relabel list"


def test_only_the_held_contents_are_released_and_a_label_replaced_since_stays_new(ledger: Ledger) -> None:
    contents = held_by_screening(ledger, "munich-12")
    fixed = relabel(ledger, "munich-12", "scene-1", "munich-12/scene-1: corrected labels", at=NOW)

    change = release_batch(ledger, "munich-12", reason="scene-0 and scene-2 are right", by=ALICE, clock=clock)

    assert change.decision.pairs == 2
    assert change.after.model_dump() == {"held": 0, "released": 2, "benchmark": 0, "trusted": 0, "new": 1}
    found = verdicts(ledger, "munich-12")
    assert fixed not in found, "the corrected pair is new: the next run screens it"
    assert found[contents["scene-1"]] is Trust.HELD, "the old label's verdict is history, kept as it was"


def test_released_pairs_the_screening_run_had_frozen_are_new_data_for_the_trigger_again(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")
    freeze(ledger, "munich-12", RUN)
    assert "munich-12" not in {batch.batch for batch, _ in ledger.closed_batches()}

    change = release_batch(ledger, "munich-12", reason="the labels are right", by=ALICE, clock=clock)

    assert change.offered == 3
    assert [pair.dataset_version for pair in ledger.pairs("munich-12")] == [None, None, None]
    (closed,) = [batch for batch, _ in ledger.closed_batches() if batch.batch == "munich-12"]
    assert closed.last_seen == NOW, "back among the closed batches, settling from the release on"


def test_a_release_leaves_the_trusted_siblings_in_the_version_they_were_frozen_into(ledger: Ledger) -> None:
    contents = curate(ledger, "munich-12", STEMS, at=UPLOADED)
    screened(
        ledger,
        "munich-12",
        {contents["scene-0"]: Trust.HELD, contents["scene-1"]: Trust.TRUSTED, contents["scene-2"]: Trust.TRUSTED},
        run=RUN,
        at=SCREENED,
    )
    freeze(ledger, "munich-12", RUN)

    change = release_batch(ledger, "munich-12", reason="scene-0 is right", by=ALICE, clock=clock)

    assert change.offered == 1
    frozen = {pair.stem: pair.dataset_version for pair in ledger.pairs("munich-12")}
    assert frozen == {"scene-0": None, "scene-1": RUN, "scene-2": RUN}, "only the released pair is new data"


def test_a_release_reads_again_a_pair_the_intake_changed_under_it(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_by_screening(ledger, "munich-12")
    freeze(ledger, "munich-12", RUN)
    original = ledger.put_pair
    raced: list[str] = []

    def intake_writes_first(record: Any, revision: int) -> None:
        if not raced:  # the intake records the pair again between the release's read and its write
            raced.append(record.stem)
            found = ledger.pair(record.batch, record.stem)
            assert found is not None
            original(found[0].model_copy(update={"image_destination_version": "v2"}), found[1] + 1)
        original(record, revision)

    monkeypatch.setattr(ledger, "put_pair", intake_writes_first)

    release_batch(ledger, "munich-12", reason="the labels are right", by=ALICE, clock=clock)

    assert [pair.dataset_version for pair in ledger.pairs("munich-12")] == [None, None, None]
    (changed,) = [pair for pair in ledger.pairs("munich-12") if pair.stem == raced[0]]
    assert changed.image_destination_version == "v2", "the intake's write is kept"


@pytest.mark.parametrize(
    ("verdict", "said"),
    [
        (None, "its pairs are new"),
        (Trust.TRUSTED, "its pairs are trusted"),
        (Trust.BENCHMARK, "its pairs are benchmark"),
    ],
)
def test_a_batch_with_no_held_pair_is_not_released_and_the_refusal_says_what_its_pairs_are(
    ledger: Ledger, verdict: Trust | None, said: str
) -> None:
    contents = curate(ledger, "berlin-3", STEMS, at=UPLOADED)
    if verdict is not None:
        screened(ledger, "berlin-3", dict.fromkeys(contents.values(), verdict), run=RUN, at=SCREENED)
    before = ledger.trust("berlin-3")

    with pytest.raises(TrustRefusedError, match=f"berlin-3 has no held pair: {said}"):
        release_batch(ledger, "berlin-3", reason="why not", by=ALICE, clock=clock)

    assert ledger.trust("berlin-3") == before, "a refused release changed the batch's trust"


@pytest.mark.parametrize("decision", DECISIONS)
def test_a_batch_the_ledger_does_not_know_is_refused_by_every_decision(ledger: Ledger, decision: str) -> None:
    with pytest.raises(TrustRefusedError, match="there is no batch no-such-drop in the ledger"):
        DECISIONS[decision](ledger, "no-such-drop", reason="a reason", by=ALICE, clock=clock)

    assert ledger.trusts() == {}, "a refused decision wrote a trust item"


# -------------------------------------------------------------------- hold --
def test_a_person_holds_a_trusted_batch_and_is_told_which_run_still_uses_it(ledger: Ledger) -> None:
    contents = trusted_by_screening(ledger, "koeln-1", ["bus-0", "bus-1"])
    ledger.acquire_lock(
        LockRecord(holder=RUN, acquired_at=SCREENED, expires_at=NOW + timedelta(hours=1)), replacing=None
    )

    change = hold_batch(ledger, "koeln-1", reason="a customer complaint about the bus labels", by=ALICE, clock=clock)

    assert (change.before.trusted, change.after.held, change.running) == (2, 2, RUN)
    assert verdicts(ledger, "koeln-1") == dict.fromkeys(contents.values(), Trust.HELD)
    assert (change.decision.verdict, change.decision.by, change.decision.reasons) == (
        "held",
        ALICE,
        ["a customer complaint about the bus labels"],
    )


def test_a_hold_applies_to_the_current_pairs_and_a_pair_added_later_is_new(ledger: Ledger) -> None:
    curate(ledger, "koeln-1", ["bus-0"], at=UPLOADED)
    hold_batch(ledger, "koeln-1", reason="wrong class map", by=ALICE, clock=clock)

    later = curate(ledger, "koeln-1", ["bus-1"], at=NOW)

    assert later["bus-1"] not in verdicts(ledger, "koeln-1"), "trust is never inherited from a batch"


def test_a_purges_lease_on_the_lock_is_no_run_that_still_uses_a_held_batch(ledger: Ledger) -> None:
    curate(ledger, "koeln-1", ["bus-0"], at=UPLOADED)
    ledger.acquire_lock(
        LockRecord(holder="purge:20270301-085959-ab12", acquired_at=NOW, expires_at=NOW + timedelta(minutes=5)),
        replacing=None,
    )

    assert hold_batch(ledger, "koeln-1", reason="by hand", by=ALICE, clock=clock).running is None


def test_held_pairs_or_a_benchmark_are_not_held_again(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")
    curate(ledger, "eval-2026", STEMS, at=UPLOADED)
    make_benchmark(ledger, "eval-2026", reason="the team's test set", by=ALICE, checked_by_hand=True, clock=clock)

    with pytest.raises(TrustRefusedError, match=f"every pair of munich-12 is held already .*run {RUN}'s screening"):
        hold_batch(ledger, "munich-12", reason="again", by=ALICE, clock=clock)
    with pytest.raises(TrustRefusedError, match=r"eval-2026 holds the team's benchmark.*--undo"):
        hold_batch(ledger, "eval-2026", reason="oops", by=ALICE, clock=clock)

    record = ledger.trust("munich-12")
    assert record is not None
    assert [d.by for d in record.decisions] == [f"run {RUN}'s screening"], "a refusal recorded a decision"


def test_a_batch_with_nothing_curated_has_nothing_to_hold(ledger: Ledger) -> None:
    ledger.touch_batch("koeln-2", UPLOADED)

    with pytest.raises(TrustRefusedError, match="koeln-2 has no curated pair to decide on"):
        hold_batch(ledger, "koeln-2", reason="pre-emptively", by=ALICE, clock=clock)


# --------------------------------------------------------------- benchmark --
def test_unscreened_pairs_become_a_benchmark_only_when_someone_checked_them_by_hand(ledger: Ledger) -> None:
    contents = curate(ledger, "eval-2026", STEMS, at=UPLOADED)

    with pytest.raises(TrustRefusedError, match="A benchmark can only be made from screened content or with"):
        make_benchmark(ledger, "eval-2026", reason="the team's test set", by=ALICE, clock=clock)
    assert ledger.trust("eval-2026") is None, "a refused benchmark wrote a trust item"

    named = make_benchmark(
        ledger, "eval-2026", reason="the team's test set", by=ALICE, checked_by_hand=True, clock=clock
    )

    assert verdicts(ledger, "eval-2026") == dict.fromkeys(contents.values(), Trust.BENCHMARK)
    assert (named.before.new, named.after.benchmark) == (3, 3)
    assert named.decision.reasons == ["the team's test set", CHECKED_BY_HAND], "the decision says it was by hand"


def test_pairs_every_one_trusted_by_screening_become_a_benchmark_without_a_hand_check(ledger: Ledger) -> None:
    trusted_by_screening(ledger, "eval-2026")

    named = make_benchmark(ledger, "eval-2026", reason="screened and passed: our test set", by=ALICE, clock=clock)

    assert named.after.benchmark == 3
    assert named.decision.reasons == ["screened and passed: our test set", SCREENED_AND_TRUSTED]


def test_a_benchmark_with_one_new_pair_among_trusted_ones_needs_the_hand_check(ledger: Ledger) -> None:
    trusted_by_screening(ledger, "eval-2026")
    relabel(ledger, "eval-2026", "scene-2", "eval-2026/scene-2: redrawn", at=NOW)

    with pytest.raises(TrustRefusedError, match=r"1 of 3 pairs of eval-2026 are not trusted \(2 trusted, 1 new\)"):
        make_benchmark(ledger, "eval-2026", reason="our test set", by=ALICE, clock=clock)


def test_held_pairs_cannot_judge_models_and_a_benchmark_is_named_once(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")
    curate(ledger, "eval-2026", STEMS, at=UPLOADED)
    make_benchmark(ledger, "eval-2026", reason="test set", by=ALICE, checked_by_hand=True, clock=clock)

    with pytest.raises(TrustRefusedError, match=r"its labels are in doubt: release it first"):
        make_benchmark(ledger, "munich-12", reason="test set", by=ALICE, checked_by_hand=True, clock=clock)
    with pytest.raises(TrustRefusedError, match="eval-2026 is the team's benchmark already"):
        make_benchmark(ledger, "eval-2026", reason="again", by=ALICE, checked_by_hand=True, clock=clock)


def test_a_benchmark_is_turned_back_into_new_pairs_and_only_a_benchmark_can_be(ledger: Ledger) -> None:
    curate(ledger, "eval-2026", STEMS, at=UPLOADED)
    held_by_screening(ledger, "munich-12")
    make_benchmark(ledger, "eval-2026", reason="test set", by=ALICE, checked_by_hand=True, clock=clock)

    with pytest.raises(TrustRefusedError, match="munich-12 is not the team's benchmark: its pairs are held"):
        undo_benchmark(ledger, "munich-12", reason="wrong batch", by=ALICE, clock=clock)
    undone = undo_benchmark(ledger, "eval-2026", reason="a new test set replaces it", by=ALICE, clock=clock)

    assert (undone.before.benchmark, undone.after.new) == (3, 3)
    assert (undone.decision.verdict, undone.decision.pairs) == (UNDONE, 3)
    assert verdicts(ledger, "eval-2026") == {}, "benchmark contents are still in the trust item"


# ---------------------------------------------------------------- overview --
def test_the_overview_lists_held_released_and_benchmark_batches_with_their_last_decision(ledger: Ledger) -> None:
    held_by_screening(ledger, "munich-12")
    held_by_screening(ledger, "night-drive")
    release_batch(ledger, "night-drive", reason="night scenes are new to the model", by=ALICE, clock=clock)
    curate(ledger, "koeln-1", ["bus-0"], at=UPLOADED)
    hold_batch(ledger, "koeln-1", reason="a customer complaint", by=ALICE, clock=clock)
    curate(ledger, "eval-2026", ["test-0", "test-1"], at=UPLOADED)
    make_benchmark(ledger, "eval-2026", reason="test set", by=ALICE, checked_by_hand=True, clock=clock)
    trusted_by_screening(ledger, "aachen-1")
    curate(ledger, "bonn-1", ["street-0"], at=UPLOADED)

    overview = trust_overview(ledger, clock=clock)

    assert [(e.batch, e.pairs.held, e.last.by if e.last else None) for e in overview.held] == [
        ("munich-12", 3, f"run {RUN}'s screening"),
        ("koeln-1", 1, ALICE),
    ], "held batches, oldest last decision first, with who decided"
    munich = overview.held[0]
    assert munich.last is not None and munich.last.reasons == [SWAPPED]
    assert munich.run_report == f"reports/runs/{RUN}/", "where the screening's findings are"
    assert (munich.to_fix, munich.report) == (3, "reports/batches/munich-12/report.md")
    assert [(e.batch, e.pairs.released) for e in overview.released] == [("night-drive", 3)]
    assert [(e.batch, e.pairs.benchmark) for e in overview.benchmark] == [("eval-2026", 2)]
    assert (overview.trusted, overview.new) == (1, 1), "aachen-1 has trusted pairs, bonn-1 no verdict at all"


def test_the_overview_of_a_ledger_without_verdicts_counts_every_batch_new(ledger: Ledger) -> None:
    curate(ledger, "bonn-1", ["street-0"], at=UPLOADED)

    overview = trust_overview(ledger, clock=clock)

    assert (overview.held, overview.released, overview.benchmark) == ([], [], [])
    assert (overview.trusted, overview.new) == (0, 1)


# ---------------------------------------------------------- the command line --
@pytest.fixture
def offline() -> Iterator[dict[str, str]]:
    """A bucket and a ledger on moto, and the credentials of an operator who assumed the trust
    role as `alice` (what `retrain data release` runs with)."""
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="data")
        create_ledger_table(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
        role = boto3.client("iam").create_role(
            RoleName="retrain-TrustOperatorRole-1A2B", AssumeRolePolicyDocument=json.dumps({"Statement": []})
        )["Role"]["Arn"]
        credentials = boto3.client("sts").assume_role(RoleArn=role, RoleSessionName="alice")["Credentials"]
        yield {
            "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
            "AWS_SESSION_TOKEN": credentials["SessionToken"],
        }


def data_command(env: dict[str, str], *args: str) -> Any:
    names = ["--bucket", "data", "--ledger-table", "ledger", "--region", "us-east-1"]
    return CliRunner().invoke(app, ["data", *args, *names], env=env)


def test_retrain_data_release_records_the_operators_role_session_and_rewrites_the_report(
    offline: dict[str, str],
) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    contents = held_by_screening(ledger, "munich-12")

    result = data_command(offline, "release", "munich-12", "--reason", "checked by hand: the labels are right")

    assert result.exit_code == 0, result.output
    alice = "arn:aws:sts::123456789012:assumed-role/retrain-TrustOperatorRole-1A2B/alice"
    record = ledger.trust("munich-12")
    assert record is not None and record.last is not None
    assert (record.last.by, record.last.reasons) == (alice, ["checked by hand: the labels are right"])
    assert verdicts(ledger, "munich-12") == dict.fromkeys(contents.values(), Trust.RELEASED)
    said = " ".join(result.stdout.split())
    assert f"Released 3 pairs of munich-12, decided by {alice}" in said, said
    body = boto3.client("s3", region_name="us-east-1").get_object(
        Bucket="data", Key="reports/batches/munich-12/report.json"
    )
    report = json.loads(body["Body"].read())
    assert report["trust"]["pairs"]["released"] == 3, "the team's report still says what it said before"


@pytest.mark.parametrize("reason", [None, "  "], ids=["missing", "blank"])
def test_retrain_data_release_without_a_reason_exits_2_naming_the_option_and_changes_nothing(
    offline: dict[str, str], reason: str | None
) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    held_by_screening(ledger, "munich-12")
    before = ledger.trust("munich-12")

    result = data_command(offline, "release", "munich-12", *(["--reason", reason] if reason is not None else []))

    assert result.exit_code == 2, result.output
    assert "--reason TEXT is required" in result.output and "nothing was changed" in result.output, result.output
    assert ledger.trust("munich-12") == before, "a release without a reason changed the batch's trust"


def test_retrain_data_benchmark_refuses_unscreened_pairs_and_takes_them_checked_by_hand(
    offline: dict[str, str],
) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    curate(ledger, "eval-2026", STEMS, at=UPLOADED)

    refused = data_command(offline, "benchmark", "eval-2026", "--reason", "our test set")
    named = data_command(offline, "benchmark", "eval-2026", "--reason", "our test set", "--checked-by-hand")

    assert refused.exit_code == 1 and "--checked-by-hand" in refused.output, refused.output
    assert named.exit_code == 0, named.output
    assert "3 pairs of eval-2026 are part of the team's benchmark" in " ".join(named.stdout.split())
    assert set(verdicts(ledger, "eval-2026").values()) == {Trust.BENCHMARK}


def test_retrain_data_release_json_is_the_change_it_recorded(offline: dict[str, str]) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    held_by_screening(ledger, "munich-12")
    freeze(ledger, "munich-12", RUN)

    result = data_command(offline, "release", "munich-12", "--reason", "the labels are right", "--json")

    assert result.exit_code == 0, result.output
    change = TrustChange.model_validate(json.loads(result.stdout))
    assert (change.batch, change.decision.verdict, change.decision.by, change.decision.reasons) == (
        "munich-12",
        "released",
        ALICE,
        ["the labels are right"],
    )
    assert (change.decision.pairs, change.before.held, change.after.released, change.offered) == (3, 3, 3, 3)
    assert change.running is None
    assert "Released" not in result.stdout, "the words are for the human output"


def test_retrain_data_hold_json_is_the_change_it_recorded(offline: dict[str, str]) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    trusted_by_screening(ledger, "koeln-3")

    result = data_command(offline, "hold", "koeln-3", "--reason", "bus labels on trams", "--json")

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["batch"], document["decision"]["verdict"], document["decision"]["by"]) == (
        "koeln-3",
        "held",
        ALICE,
    )
    assert document["decision"]["reasons"] == ["bus labels on trams"]
    assert (document["before"]["trusted"], document["after"]["held"], document["running"]) == (3, 3, None)
    assert set(verdicts(ledger, "koeln-3").values()) == {Trust.HELD}


def test_retrain_data_benchmark_json_is_the_change_it_recorded_and_so_is_its_undo(offline: dict[str, str]) -> None:
    ledger = Ledger(boto3.client("dynamodb", region_name="us-east-1"), "ledger")
    curate(ledger, "eval-2026", STEMS, at=UPLOADED)

    named = data_command(offline, "benchmark", "eval-2026", "--reason", "our test set", "--checked-by-hand", "--json")
    undone = data_command(offline, "benchmark", "eval-2026", "--undo", "--reason", "a new test set", "--json")

    assert named.exit_code == 0, named.output
    document = json.loads(named.stdout)
    assert (document["batch"], document["decision"]["verdict"], document["decision"]["pairs"]) == (
        "eval-2026",
        "benchmark",
        3,
    )
    assert document["decision"]["reasons"] == ["our test set", CHECKED_BY_HAND]
    assert (document["before"]["new"], document["after"]["benchmark"]) == (3, 3)
    assert undone.exit_code == 0, undone.output
    document = json.loads(undone.stdout)
    assert (document["decision"]["verdict"], document["before"]["benchmark"], document["after"]["new"]) == (
        UNDONE,
        3,
        3,
    )
