"""An engineer decides which batches' labels are trained on (`retrain data held`, `release`,
`hold`, `benchmark`), and erases a held batch nobody wants (`retrain data purge BATCH/`), on the
offline stack. Runs wait an hour in a stand-in machine; a test plays each run's screening (a
held batch's trust record, as the evaluation writes it) and its end (the lock released)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from functions.common.contracts import parse_manifest
from functions.data.models import Trust, TrustRecord
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import drain, executions, scene, upload, wait_until
from tests.integration.test_data_operations import (
    cli,
    drop,
    finish,
    hold_runs,
    ledger_of,
    read,
    trigger,
    versions,
)

SWAPPED = "likely label errors on 41 % of its pixels (trusted pairs: 6 %): road labelled as sidewalk"
# Seeds whose image lands in the validation split (val_fraction 0.1): every version needs one.
MUNICH, BERLIN = range(0, 4), range(8, 10)


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
    """What the run's evaluation writes when its screening holds a batch."""
    record = TrustRecord(
        batch=batch, trust=Trust.HELD, reasons=[SWAPPED], run=run, by="screening", at=datetime.now(UTC)
    )
    assert ledger_of(stack).hold(record), f"screening could not hold {batch}"


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


def test_a_batch_screening_held_is_listed_with_its_run_and_reasons_and_released_into_the_next_version(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    first = next_run(data_stack, "munich", MUNICH)
    screening_holds(data_stack, "munich", first)
    finish(data_stack, first)

    found = listed(data_stack)

    (held,) = found["held"]
    assert (held["batch"], held["by"], held["run"], held["pairs"]) == ("munich", "screening", first, 4), held
    assert held["reasons"] == [SWAPPED] and held["run_report"] == f"reports/runs/{first}/"
    assert (found["released"], found["benchmark"], found["new"]) == ([], [], 0)
    table = cli(data_stack, "held")
    assert table.exit_code == 0, table.output
    for said in ("Held (1)", "munich", f"run {first}'s screening", "road labelled as sidewalk", "release"):
        assert said in table.output, f"{said!r} missing from:\n{table.output}"
    assert trust_in_status(data_stack) == {"munich": "held"}
    second = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, second) == {"berlin": "new"}, "the held batch is in a later version"
    finish(data_stack, second)

    released = cli(data_stack, "release", "munich", "--reason", "checked by hand: the labels are right")

    assert released.exit_code == 0, released.output
    assert "Released munich: the next run includes it" in released.output, released.output
    assert "its 4 curated pairs are new data again" in released.output, released.output
    after = listed(data_stack)
    assert after["held"] == [], after
    (entry,) = after["released"]
    assert entry["by"] == "operator" and entry["reasons"] == [
        "checked by hand: the labels are right",
        f"held: {SWAPPED}",
    ]
    assert "Released (1)" in cli(data_stack, "held").output
    # Screening's run froze munich's pairs into its version, but no model trained on them: the
    # release alone starts the next run (the trigger's schedule here), with no other drop.
    third = trigger(data_stack)["started"]
    assert third, "the released pairs are new data"
    assert trusts_in(data_stack, third) == {"munich": "released", "berlin": "new"}


def test_an_operators_hold_leaves_the_batch_out_from_the_next_run_while_the_running_one_keeps_it(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    running = next_run(data_stack, "koeln", MUNICH)

    result = cli(data_stack, "hold", "koeln", "--reason", "a customer reported bus labels on trams")

    assert result.exit_code == 0, result.output
    for said in (
        "Held koeln (it was new)",
        "every run from the next on leaves it out",
        "A run already running still uses it",
        running,
    ):
        assert said in result.output, f"{said!r} missing from:\n{result.output}"
    assert "koeln" in trusts_in(data_stack, running), "the running run's version was changed"
    (held,) = listed(data_stack)["held"]
    assert (held["batch"], held["by"], held["run"]) == ("koeln", "operator", None)
    assert held["reasons"] == ["a customer reported bus labels on trams"]
    table = cli(data_stack, "held").output
    assert "operator" in table and "a customer reported bus labels on trams" in table, table
    finish(data_stack, running)
    later = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, later) == {"berlin": "new"}, "the held batch is in the next version"


def test_a_benchmark_batch_is_named_listed_frozen_as_such_and_turned_back_into_a_new_batch(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    # The team's evaluation drop: a validation pair alone starts no run (nothing to train on).
    drop(data_stack, "eval-2026", range(3, 4))
    drain(data_stack)
    assert executions(data_stack) == []

    named = cli(data_stack, "benchmark", "eval-2026")

    assert named.exit_code == 0, named.output
    assert "eval-2026 is part of the team's benchmark from the next run on" in named.output, named.output
    (entry,) = listed(data_stack)["benchmark"]
    assert (entry["batch"], entry["by"]) == ("eval-2026", "operator")
    assert "Benchmark (1)" in cli(data_stack, "held").output
    assert trust_in_status(data_stack) == {"eval-2026": "benchmark"}
    run = next_run(data_stack, "berlin", BERLIN)
    assert trusts_in(data_stack, run) == {"eval-2026": "benchmark", "berlin": "new"}
    finish(data_stack, run)

    undone = cli(data_stack, "benchmark", "eval-2026", "--undo")

    assert undone.exit_code == 0, undone.output
    assert "eval-2026 is a new batch again" in undone.output
    assert listed(data_stack)["benchmark"] == []
    assert trust_in_status(data_stack)["eval-2026"] == "new"


def test_decisions_that_do_not_apply_exit_1_say_why_and_change_nothing(data_stack: OfflineStack) -> None:
    upload(data_stack, "incoming/munich/images/x.jpg", scene(0).image)
    upload(data_stack, "incoming/eval-2026/images/y.jpg", scene(1).image)
    drain(data_stack)
    screening_holds(data_stack, "munich", "ds-20261205T090000Z-4f2a")
    assert cli(data_stack, "benchmark", "eval-2026").exit_code == 0
    before = listed(data_stack)

    refusals = {
        ("release", "no-such-drop"): "there is no batch no-such-drop in the ledger",
        ("hold", "no-such-drop"): "there is no batch no-such-drop in the ledger",
        ("release", "eval-2026"): "eval-2026 is not held: it is benchmark",
        ("hold", "munich"): "munich is held already (by run ds-20261205T090000Z-4f2a's screening",
        ("hold", "eval-2026"): "eval-2026 is the team's benchmark",
        ("benchmark", "munich"): "release it first (`retrain data release munich`)",
        ("benchmark", "eval-2026"): "eval-2026 is the team's benchmark already",
    }
    for (command, batch), said in refusals.items():
        result = cli(data_stack, command, batch)
        assert result.exit_code == 1, f"{command} {batch}: {result.output}"
        assert said in result.output and "nothing was changed" in result.output, f"{command} {batch}: {result.output}"
    undo = cli(data_stack, "benchmark", "munich", "--undo")
    assert undo.exit_code == 1 and "munich is not the team's benchmark: it is held" in undo.output, undo.output

    assert listed(data_stack) | {"at": None} == before | {"at": None}, "a refused decision changed a trust record"
    nowhere = cli(data_stack, "held", "--bucket", "no-such-bucket")
    assert nowhere.exit_code == 2 and "no bucket no-such-bucket" in nowhere.output, nowhere.output


def test_a_held_batch_purged_whole_is_gone_with_its_trust_record_and_the_audit_stays_clean(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    first = next_run(data_stack, "munich", MUNICH)
    screening_holds(data_stack, "munich", first)
    finish(data_stack, first)
    second = next_run(data_stack, "berlin", BERLIN)
    finish(data_stack, second)
    assert trusts_in(data_stack, second) == {"berlin": "new"}

    # No grace: nothing may hide behind "too recent". The held batch's pairs are in no new version.
    code, report = audited(data_stack)
    assert (code, report["discrepancies"]) == (0, []), report["discrepancies"]
    assert report["checked"]["held_batches"] == 1, report["checked"]
    assert "1 batch held" in cli(data_stack, "audit", "--grace-seconds", "0").output

    dry = cli(data_stack, "purge", "munich/", "--dry-run")
    assert dry.exit_code == 0 and "Would erase the whole batch munich with its trust record" in dry.output, dry.output
    assert ledger_of(data_stack).trust("munich") is not None, "a dry run forgot the batch's trust"

    result = cli(data_stack, "purge", "munich/", "--json")

    assert result.exit_code == 0, result.output
    purged = json.loads(result.stdout)
    assert purged["batches"] == ["munich"] and purged["unmatched"] == [] and purged["remaining"] == [], purged
    assert "batch#munich trust" in purged["ledger_items"]
    assert {p["stem"] or p["key"] for p in purged["pairs"]} == {
        "scene-0",
        "scene-1",
        "scene-2",
        "scene-3",
        "incoming/munich/_COMPLETE",
    }, purged["pairs"]
    assert ledger_of(data_stack).trust("munich") is None, "the purged batch's trust record is still there"
    left = sorted(key for key, _ in versions(data_stack) if "munich/" in key and not key.startswith("reports/"))
    assert left == [], f"the purged batch is still in the bucket: {left}"
    assert trusts_in(data_stack, first) == {}, "the first version still lists the purged batch"
    assert trusts_in(data_stack, second) == {"berlin": "new"}, "a batch nobody purged lost pairs"
    found = listed(data_stack)
    assert found["held"] == [] and "No batch is held" in cli(data_stack, "held").output
    code, report = audited(data_stack)
    assert (code, report["discrepancies"], report["checked"]["held_batches"]) == (0, [], 0), report

    again = cli(data_stack, "purge", "munich/")
    assert again.exit_code == 1 and "matched nothing: munich" in again.output, again.output
    unknown = cli(data_stack, "purge", "no-such-drop/")
    assert unknown.exit_code == 2 and "there is no batch no-such-drop" in unknown.output, unknown.output


def audited(stack: OfflineStack) -> tuple[int, dict[str, Any]]:
    result = cli(stack, "audit", "--json", "--grace-seconds", "0")
    assert result.exit_code in {0, 1}, result.output
    return result.exit_code, json.loads(result.stdout)
