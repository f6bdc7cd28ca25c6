"""Batches a run has consumed leave the trigger's list, and a late file brings its batch back.

The trigger reads the closed batches at every look: those whose curated pairs are all in a
dataset version are moved out of that list, so what it reads does not grow with the history.
Runs here wait an hour in a stand-in machine: each holds the lock until the test releases it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from functions.common.contracts import parse_manifest
from functions.data.ledger import Ledger
from retrain.local.cloudformation.stack import OfflineStack
from retrain.ops.status import data_status
from tests.integration.data_drops import (
    bad_label,
    drain,
    executions,
    scene,
    upload,
    upload_pair,
    wait_until,
)
from tests.integration.helpers import create_machine
from tests.integration.runs import release_and_look

# scene(3) lands in the validation split, 1 and 2 in training: the first run needs both.
FIRST_DROP = (1, 2, 3)
TRIGGER = "retrain-local-TriggerFunction"


def in_state(stack: OfflineStack, state: str) -> list[str]:
    """The batches the ledger's state index lists under `state`."""
    items = stack.aws.dynamodb.query(
        TableName=stack.ref("LedgerTable"),
        IndexName="state",
        KeyConditionExpression="state_pk = :state",
        ExpressionAttributeValues={":state": {"S": state}},
    )["Items"]
    return sorted(item["pk"]["S"].removeprefix("batch#") for item in items)


def hold_runs_in_a_waiting_machine(stack: OfflineStack) -> None:
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec(TRIGGER)
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))


def trigger(stack: OfflineStack, **event: str) -> dict[str, object]:
    invocation = stack.runtime.invoke(TRIGGER, event)
    assert not invocation.failed, invocation.payload
    return invocation.payload  # type: ignore[no-any-return]


def drop(stack: OfflineStack, batch: str, seeds: tuple[int, ...]) -> None:
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))
    upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    drain(stack)


def ledger_of(stack: OfflineStack) -> Ledger:
    return Ledger(stack.aws.dynamodb, stack.ref("LedgerTable"))


def wait_until_consumed(stack: OfflineStack, batch: str) -> None:
    wait_until(lambda: batch in in_state(stack, "batch-consumed"), message=f"{batch} consumed by its run")


def three_drops_each_trained_once(stack: OfflineStack) -> list[str]:
    """Three drops one after another; each starts its run (the marker kicks the trigger), and
    the run's end releases the lock. The batches, in order."""
    hold_runs_in_a_waiting_machine(stack)
    batches = ["week-1", "week-2", "week-3"]
    for number, batch in enumerate(batches):
        drop(stack, batch, FIRST_DROP if number == 0 else (10 + number,))
        wait_until_consumed(stack, batch)
        lock = ledger_of(stack).lock()
        assert lock is not None, f"the run of {batch} holds the lock"
        assert release_and_look(stack, lock.holder)["started"] is None, "nothing new after the run"
    assert len(executions(stack)) == 3
    return batches


def test_batches_whose_pairs_a_run_took_leave_the_triggers_list_but_not_the_status(
    data_stack: OfflineStack,
) -> None:
    batches = three_drops_each_trained_once(data_stack)

    assert in_state(data_stack, "batch-closed") == [], "the trigger has no past batch to read"
    assert in_state(data_stack, "batch-consumed") == batches
    status = data_status(ledger_of(data_stack), data_stack.aws.s3, data_stack.ref("DataBucket"))
    assert sorted(b.batch for b in status.batches) == batches, "people still see every batch"
    assert {b.status.value for b in status.batches} == {"closed"}


def test_a_late_pair_for_a_consumed_batch_brings_it_back_and_the_next_run_takes_it(
    data_stack: OfflineStack,
) -> None:
    three_drops_each_trained_once(data_stack)

    upload_pair(data_stack, "week-1", "scene-40", scene(40))  # a pair the annotators forgot
    drain(data_stack)

    # Curated into a closed batch: the intake asks the trigger to look, and the run starts.
    wait_until(lambda: len(executions(data_stack)) == 4, message="the late pair's run")
    after = [i.payload for i in data_stack.runtime.invocations if i.function == TRIGGER][-1]
    assert after["started"], after
    assert after["reason"] == "1 new pairs (threshold 1)"
    manifest = data_stack.aws.s3.get_object(
        Bucket=data_stack.ref("DataBucket"), Key=f"dataset/manifests/{after['started']}.jsonl"
    )["Body"].read()
    images = {entry.image for entry in parse_manifest(manifest.decode())}
    assert "images/week-1/scene-40.jpg" in images
    assert len(images) == 6, "cumulative: the five pairs before and the late one"
    assert in_state(data_stack, "batch-closed") == [], "taken by the run: consumed again"


def test_a_late_file_that_is_quarantined_brings_its_batch_back_only_until_the_next_look(
    data_stack: OfflineStack,
) -> None:
    three_drops_each_trained_once(data_stack)

    upload(data_stack, "incoming/week-2/labels/scene-99.png", bad_label([0, 200]))  # 200: no class
    drain(data_stack)
    assert in_state(data_stack, "batch-closed") == ["week-2"]

    looked = trigger(data_stack)

    assert looked == {"started": None, "reason": "no new curated pairs in closed batches"}
    assert in_state(data_stack, "batch-closed") == []


def test_an_object_that_lands_while_the_trigger_looks_keeps_its_batch_in_the_list(
    data_stack: OfflineStack,
) -> None:
    three_drops_each_trained_once(data_stack)
    ledger = ledger_of(data_stack)
    ledger.touch_batch("week-3", datetime.now(UTC))  # a late object: back in the list
    ((seen, revision),) = ledger.closed_batches()  # what a trigger reads

    ledger.touch_batch("week-3", datetime.now(UTC))  # another object, before the trigger consumes

    assert not ledger.consume_batch(seen, revision), "its new pair may be on its way"
    assert in_state(data_stack, "batch-closed") == ["week-3"]
    ((current, now_revision),) = ledger.closed_batches()
    assert ledger.consume_batch(current, now_revision), "with nothing new since, it is consumed"
    assert in_state(data_stack, "batch-consumed") == ["week-1", "week-2", "week-3"]
