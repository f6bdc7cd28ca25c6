"""An engineer decides which pairs' labels are trained on (`retrain data held`, `release`, `hold`,
`benchmark`), each decision recorded with who made it (STS) and why (`--reason`), and erases a held
batch nobody wants (`retrain data purge BATCH/`), on the offline stack. Runs wait an hour in a
stand-in machine; a test plays each run's screening (its pairs' verdicts, as the evaluation
writes them) and its end (the lock released)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from functions.common.contracts import parse_manifest
from functions.data.models import BatchTrust, PairToFix, Trust, TrustDecision
from functions.data.reports import curated_contents
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.aws_calls import operator_calls
from tests.integration.data_drops import drain, executions, scene, upload_pair, wait_until
from tests.integration.test_data_operations import (
    cli,
    drop,
    finish,
    hold_runs,
    ledger_of,
    read,
    role_refusals,
    trigger,
    versions,
)

SWAPPED = "likely label errors on 41 % of its pixels (trusted pairs: 6 %): road labelled as sidewalk"
# Seeds whose image lands in the validation split (val_fraction 0.1): every version needs one.
MUNICH, BERLIN = range(0, 4), range(8, 10)
PICTURE = b"\x89PNG\r\n\x1a\n the worst pair, with the model's view beside it"
REASON = "checked by hand: the labels are right"


def next_run(stack: OfflineStack, batch: str, seeds: range) -> str:
    """A drop whose marker starts the next run (it waits, holding the lock); the run's name."""
    count = len(executions(stack))
    drop(stack, batch, seeds)
    drain(stack)
    wait_until(lambda: len(executions(stack)) == count + 1, message=f"a run on {batch}'s drop")
    return str(max(executions(stack), key=lambda e: e["startDate"])["name"])


def trusts_in(stack: OfflineStack, run: str) -> dict[str, str]:
    """The batches in the run's dataset version, with the trust each was frozen with."""
    text = read(stack, f"dataset/manifests/{run}.jsonl").decode()
    return {entry.batch: entry.trust for entry in parse_manifest(text)}


def screening_holds(stack: OfflineStack, batch: str, run: str) -> None:
    """What the run's evaluation writes when its screening holds a batch: every curated pair's
    content held, the worst pair on the team's relabel list with its picture beside the report."""
    ledger = ledger_of(stack)
    contents = curated_contents(ledger.pairs(batch))
    assert contents, f"{batch} has no curated pair to hold"
    worst = min(contents)
    stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=f"reports/batches/{batch}/fix/1.png", Body=PICTURE)
    decision = TrustDecision(
        verdict="held",
        by=f"run {run}'s screening",
        run=run,
        at=datetime.now(UTC),
        reasons=[SWAPPED],
        pairs=len(contents),
    )
    fix = PairToFix(
        image=f"images/{batch}/{worst}.jpg",
        label=f"labels/{batch}/{worst}.png",
        digest=contents[worst],
        why="labelled sidewalk where the model sees road",
        quality=0.05,
        picture="fix/1.png",
        run=run,
    )

    def held(current: BatchTrust) -> BatchTrust:
        return current.model_copy(
            update={
                "pairs": {**current.pairs, **dict.fromkeys(contents.values(), Trust.HELD)},
                "decisions": [*current.decisions, decision],
                "to_fix": [fix],
            }
        )

    assert ledger.update_trust(batch, held) is not None, f"screening could not hold {batch}"


def spoken(result: Any) -> str:
    """A command's output as one line: rich wraps long sentences at the terminal's width."""
    return " ".join(result.output.split())


def listed(stack: OfflineStack) -> dict[str, Any]:
    result = cli(stack, "held", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def trust_in_status(stack: OfflineStack) -> dict[str, str]:
    result = cli(stack, "status", "--json")
    assert result.exit_code == 0, result.output
    return {batch["batch"]: batch["trust"] for batch in json.loads(result.stdout)["batches"]}


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands read DATA_BUCKET and LEDGER_TABLE: only what a test passes counts."""
    monkeypatch.delenv("DATA_BUCKET", raising=False)
    monkeypatch.delenv("LEDGER_TABLE", raising=False)


def test_pairs_screening_held_are_listed_with_their_run_and_reasons_and_released_into_the_next_version(
    data_stack: OfflineStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold_runs(data_stack)
    first = next_run(data_stack, "munich", MUNICH)
    screening_holds(data_stack, "munich", first)
    finish(data_stack, first)

    found = listed(data_stack)

    (held,) = found["held"]
    assert (held["batch"], held["pairs"]["held"], held["to_fix"]) == ("munich", 4, 1), held
    assert (held["last"]["by"], held["last"]["run"], held["last"]["reasons"]) == (
        f"run {first}'s screening",
        first,
        [SWAPPED],
    )
    assert held["run_report"] == f"reports/runs/{first}/" and held["report"] == "reports/batches/munich/report.md"
    assert (found["released"], found["benchmark"], found["new"]) == ([], [], 0)
    table = spoken(cli(data_stack, "held"))
    for said in ("Held (1)", "munich: held (of 4 pairs curated)", f"run {first}'s screening", "sidewalk", "release"):
        assert said in table, f"{said!r} missing from:\n{table}"
    assert trust_in_status(data_stack) == {"munich": "held"}
    second = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, second) == {"berlin": "new"}, "the held pairs are in a later version"
    finish(data_stack, second)

    with operator_calls(monkeypatch) as calls:
        released = cli(data_stack, "release", "munich", "--reason", REASON)

    assert released.exit_code == 0, released.output
    assert role_refusals(data_stack, calls, "TrustOperatorRole") == [], "calls TrustOperatorRole would be refused"
    after = listed(data_stack)
    assert after["held"] == [], after
    (entry,) = after["released"]
    who = entry["last"]["by"]
    assert who.startswith("arn:aws:"), f"the decision names no identity AWS knows: {who}"
    assert (entry["last"]["verdict"], entry["last"]["reasons"], entry["pairs"]["released"]) == ("released", [REASON], 4)
    said = spoken(released)
    assert f"Released 4 pairs of munich, decided by {who}: the next run includes them" in said, said
    assert "4 pairs are new data again" in said, said
    assert "Released (1)" in cli(data_stack, "held").output
    report = json.loads(read(data_stack, "reports/batches/munich/report.json"))
    assert report["trust"]["summary"] == "released" and report["trust"]["to_fix"] == [], "the report was not rewritten"
    # Screening's run froze munich's pairs into its version, but no model trained on them: the
    # release alone starts the next run (the trigger's schedule here), with no other drop.
    third = trigger(data_stack)["started"]
    assert third, "the released pairs are new data"
    assert trusts_in(data_stack, third) == {"munich": "released", "berlin": "new"}


def test_an_operators_hold_leaves_the_pairs_out_from_the_next_run_while_the_running_one_keeps_them(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    running = next_run(data_stack, "koeln", MUNICH)

    result = cli(data_stack, "hold", "koeln", "--reason", "a customer reported bus labels on trams")

    assert result.exit_code == 0, result.output
    said = spoken(result)
    for expected in (
        "Held 4 pairs of koeln (they were: new), decided by arn:aws:",
        "every run from the next on leaves them out",
        "Pairs uploaded to it later are new, and screened",
        "A run already running still uses them",
        running,
    ):
        assert expected in said, f"{expected!r} missing from:\n{said}"
    assert "koeln" in trusts_in(data_stack, running), "the running run's version was changed"
    (held,) = listed(data_stack)["held"]
    assert (held["batch"], held["last"]["run"], held["last"]["reasons"]) == (
        "koeln",
        None,
        ["a customer reported bus labels on trams"],
    )
    assert held["last"]["by"].startswith("arn:aws:"), held["last"]
    table = spoken(cli(data_stack, "held"))
    assert held["last"]["by"] in table and "a customer reported bus labels on trams" in table, table
    finish(data_stack, running)
    later = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, later) == {"berlin": "new"}, "the held pairs are in the next version"


def test_a_benchmark_checked_by_hand_is_named_listed_frozen_as_such_and_turned_back_into_new_pairs(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    # The team's evaluation drop: a validation pair alone starts no run (nothing to train on).
    drop(data_stack, "eval-2026", range(3, 4))
    drain(data_stack)
    assert executions(data_stack) == []

    unscreened = cli(data_stack, "benchmark", "eval-2026", "--reason", "the team's test set")
    named = cli(data_stack, "benchmark", "eval-2026", "--reason", "the team's test set", "--checked-by-hand")

    assert unscreened.exit_code == 1 and "checked by hand" in spoken(unscreened), unscreened.output
    assert named.exit_code == 0, named.output
    assert "1 pair of eval-2026 is part of the team's benchmark from the next run on (checked by hand)" in spoken(
        named
    ), named.output
    (entry,) = listed(data_stack)["benchmark"]
    assert (entry["batch"], entry["last"]["reasons"]) == (
        "eval-2026",
        ["the team's test set", "its labels were checked by hand"],
    ), entry
    assert "Benchmark (1)" in cli(data_stack, "held").output
    assert trust_in_status(data_stack) == {"eval-2026": "benchmark"}
    run = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, run) == {"eval-2026": "benchmark", "berlin": "new"}
    finish(data_stack, run)

    undone = cli(data_stack, "benchmark", "eval-2026", "--undo", "--reason", "a new test set replaces it")

    assert undone.exit_code == 0, undone.output
    assert "1 pair of eval-2026 is new again" in spoken(undone), undone.output
    assert listed(data_stack)["benchmark"] == []
    assert trust_in_status(data_stack)["eval-2026"] == "new"


def test_decisions_that_do_not_apply_exit_1_say_why_and_change_nothing(data_stack: OfflineStack) -> None:
    # Open batches (no marker): curated pairs, and no run to wait for.
    upload_pair(data_stack, "munich", "x", scene(0))
    upload_pair(data_stack, "eval-2026", "y", scene(1))
    drain(data_stack)
    screening_holds(data_stack, "munich", "ds-20261205T090000Z-4f2a")
    benchmark = ("--reason", "the team's test set", "--checked-by-hand")
    assert cli(data_stack, "benchmark", "eval-2026", *benchmark).exit_code == 0
    before = listed(data_stack)

    refusals = {
        ("release", "no-such-drop"): "there is no batch no-such-drop in the ledger",
        ("hold", "no-such-drop"): "there is no batch no-such-drop in the ledger",
        ("release", "eval-2026"): "eval-2026 has no held pair: its pairs are benchmark",
        (
            "hold",
            "munich",
        ): "every pair of munich is held already (last decision: held by run ds-20261205T090000Z-4f2a's",
        ("hold", "eval-2026"): "eval-2026 holds the team's benchmark",
        ("benchmark", "munich"): "release it first (`retrain data release munich --reason ...`)",
        ("benchmark", "eval-2026"): "eval-2026 is the team's benchmark already",
    }
    for (command, batch), said in refusals.items():
        # A benchmark checked by hand: refused for what the batch is, not for how it was checked.
        by_hand = ["--checked-by-hand"] if command == "benchmark" else []
        result = cli(data_stack, command, batch, "--reason", "a reason", *by_hand)
        assert result.exit_code == 1, f"{command} {batch}: {result.output}"
        assert said in spoken(result) and "nothing was changed" in spoken(result), f"{command} {batch}: {result.output}"
    undo = cli(data_stack, "benchmark", "munich", "--undo", "--reason", "a reason")
    assert undo.exit_code == 1 and "munich is not the team's benchmark: its pairs are held" in spoken(undo), undo.output
    for command in ("release", "hold", "benchmark"):
        unexplained = cli(data_stack, command, "munich")
        assert unexplained.exit_code == 2, f"{command} without --reason: {unexplained.output}"
        assert "--reason TEXT is required" in spoken(unexplained), unexplained.output

    assert listed(data_stack) | {"at": None} == before | {"at": None}, "a refused decision changed a trust item"
    nowhere = cli(data_stack, "held", "--bucket", "no-such-bucket")
    assert nowhere.exit_code == 2 and "no bucket no-such-bucket" in nowhere.output, nowhere.output


def test_a_held_batch_purged_whole_is_gone_with_its_trust_item_and_pictures_and_the_audit_stays_clean(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    first = next_run(data_stack, "munich", MUNICH)
    screening_holds(data_stack, "munich", first)
    finish(data_stack, first)
    second = next_run(data_stack, "berlin", BERLIN)
    finish(data_stack, second)
    assert trusts_in(data_stack, second) == {"berlin": "new"}

    # No grace: nothing may hide behind "too recent". The held pairs are in no new version.
    code, report = audited(data_stack)
    assert (code, report["discrepancies"]) == (0, []), report["discrepancies"]
    assert (report["checked"]["held_batches"], report["checked"]["held_pairs"]) == (1, 4), report["checked"]
    assert "4 pairs held in 1 batch" in spoken(cli(data_stack, "audit", "--grace-seconds", "0"))

    dry = cli(data_stack, "purge", "munich/", "--dry-run")
    assert dry.exit_code == 0 and "Would erase the whole batch munich with its trust item" in spoken(dry), dry.output
    assert ledger_of(data_stack).trust("munich") is not None, "a dry run forgot the batch's trust"
    assert versions(data_stack, "reports/batches/munich/fix/"), "a dry run erased the relabel list's picture"

    result = cli(data_stack, "purge", "--yes", "munich/", "--json")

    assert result.exit_code == 0, result.output
    purged = json.loads(result.stdout)
    assert purged["batches"] == ["munich"] and purged["unmatched"] == [] and purged["remaining"] == [], purged
    assert "trust#munich trust" in purged["ledger_items"]
    assert {p["stem"] or p["key"] for p in purged["pairs"]} == {
        "scene-0",
        "scene-1",
        "scene-2",
        "scene-3",
        "incoming/munich/_COMPLETE",
    }, purged["pairs"]
    assert ledger_of(data_stack).trust("munich") is None, "the purged batch's trust item is still there"
    assert versions(data_stack, "reports/batches/munich/fix/") == set(), "the picture of a purged pair is still there"
    left = sorted(key for key, _ in versions(data_stack) if "munich/" in key and not key.startswith("reports/"))
    assert left == [], f"the purged batch is still in the bucket: {left}"
    assert trusts_in(data_stack, first) == {}, "the first version still lists the purged batch"
    assert trusts_in(data_stack, second) == {"berlin": "new"}, "a batch nobody purged lost pairs"
    found = listed(data_stack)
    assert found["held"] == [] and "No pair is held" in cli(data_stack, "held").output
    code, report = audited(data_stack)
    assert (code, report["discrepancies"], report["checked"]["held_batches"]) == (0, [], 0), report

    again = cli(data_stack, "purge", "--yes", "munich/")
    assert again.exit_code == 1 and "matched nothing: munich" in again.output, again.output
    unknown = cli(data_stack, "purge", "--yes", "no-such-drop/")
    assert unknown.exit_code == 2 and "there is no batch no-such-drop" in unknown.output, unknown.output


def audited(stack: OfflineStack) -> tuple[int, dict[str, Any]]:
    result = cli(stack, "audit", "--json", "--grace-seconds", "0")
    assert result.exit_code in {0, 1}, result.output
    return result.exit_code, json.loads(result.stdout)
