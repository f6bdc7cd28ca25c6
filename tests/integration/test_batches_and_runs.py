"""From closed batches to frozen dataset versions, and exactly one retraining per data drop."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from functions.common.contracts import parse_manifest, split_for
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    drain,
    executions,
    fates,
    scene,
    upload,
    upload_pair,
    wait_until,
)
from tests.integration.helpers import create_machine
from tests.integration.runs import RUN_TIMEOUT, release_and_look

# scene(3) lands in the validation split (by its content hash), 1 and 2 in training: a run needs
# both, and BatchNorm two images per step.
WITH_VALIDATION = (1, 2, 3)


def read(stack: OfflineStack, key: str) -> bytes:
    return stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()


def finished(stack: OfflineStack) -> list[dict[str, object]]:
    return [e for e in executions(stack) if e["status"] != "RUNNING"]


def drop(stack: OfflineStack, batch: str, seeds: Iterable[int], marker: bool = True) -> None:
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))
    if marker:
        upload(stack, f"incoming/{batch}/_COMPLETE", b"")


def test_a_drop_closed_by_its_marker_is_reported_frozen_and_trained_once(
    data_stack: OfflineStack,
) -> None:
    drop(data_stack, "munich-12", WITH_VALIDATION)

    drain(data_stack)
    wait_until(lambda: len(finished(data_stack)) == 1, timeout=RUN_TIMEOUT, message="one finished run")

    (run,) = executions(data_stack)
    assert run["status"] == "SUCCEEDED"
    version = run["name"]
    entries = parse_manifest(read(data_stack, f"dataset/manifests/{version}.jsonl").decode())
    assert sorted(e.image for e in entries) == [f"images/munich-12/scene-{i}.jpg" for i in WITH_VALIDATION]
    for entry in entries:
        head = data_stack.aws.s3.head_object(Bucket=data_stack.ref("DataBucket"), Key=f"dataset/{entry.image}")
        assert entry.image_version_id == head["VersionId"], "the manifest pins the curated bytes"
        assert entry.split == split_for(entry.image_sha256, 0.1)
        assert sum(entry.class_pixels.values()) > 0
    report = json.loads(read(data_stack, "reports/batches/munich-12/report.json"))
    assert report["status"] == "closed" and report["closed_by"] == "marker"
    assert report["accepted"] == [f"scene-{i}" for i in WITH_VALIDATION]
    assert "# Batch munich-12" in read(data_stack, "reports/batches/munich-12/report.md").decode()
    # The run's last state released the lock, and the trigger looked for new data (there was none).
    (release,) = [i for i in data_stack.runtime.invocations if "ReleaseFunction" in i.function]
    assert release.payload["released"] is True

    def looks_after() -> list[Any]:
        invocations = data_stack.runtime.invocations
        return [i for i in invocations if "Trigger" in i.function and i.started_at > release.ended_at]

    wait_until(lambda: bool(looks_after()), message="the trigger's look after the release")
    assert all(i.payload["started"] is None for i in looks_after())
    assert_every_upload_accounted_for_once(data_stack)


@pytest.mark.parametrize("data_stack", [{"QuietPeriodSeconds": "0"}], indirect=True)
def test_a_drop_without_a_marker_is_closed_by_the_sweeper_after_its_quiet_period(
    data_stack: OfflineStack,
) -> None:
    drop(data_stack, "no-marker", WITH_VALIDATION, marker=False)
    drain(data_stack)
    assert executions(data_stack) == []

    (sweeper,) = [s for s in data_stack.ticker.schedules if "Sweeper" in s.function]
    swept = data_stack.ticker.tick(sweeper)

    assert swept.payload["closed"] == ["no-marker"]
    wait_until(lambda: len(executions(data_stack)) == 1, message="one run started")
    report = json.loads(read(data_stack, "reports/batches/no-marker/report.json"))
    assert report["closed_by"] == "quiet period"


@pytest.mark.parametrize("data_stack", [{"IncompleteAfterSeconds": "0"}], indirect=True)
def test_an_image_whose_label_never_came_is_quarantined_as_incomplete(
    data_stack: OfflineStack,
) -> None:
    upload(data_stack, "incoming/b9/images/lonely.jpg", scene(9).image)
    upload(data_stack, "incoming/b9/_COMPLETE", b"")
    drain(data_stack)

    (sweeper,) = [s for s in data_stack.ticker.schedules if "Sweeper" in s.function]
    assert data_stack.ticker.tick(sweeper).payload["incomplete"] == 1

    (record,) = [r for r in fates(data_stack).values() if r["key"].endswith("lonely.jpg")]
    assert record["status"] == "quarantined"
    assert record["reasons"][0]["code"] == "missing_label"
    report = json.loads(read(data_stack, "reports/batches/b9/report.json"))
    assert report["pairs"] == {"incomplete": 1}
    assert_every_upload_accounted_for_once(data_stack)


def hold_runs_in_a_waiting_machine(stack: OfflineStack) -> str:
    """Point the trigger at a machine whose runs wait an hour: a run that holds the lock."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec("retrain-local-TriggerFunction")
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))
    return machine


def trigger(stack: OfflineStack, **event: str) -> dict[str, object]:
    invocation = stack.runtime.invoke("retrain-local-TriggerFunction", event)
    assert not invocation.failed, invocation.payload
    return invocation.payload  # type: ignore[no-any-return]


def test_drops_that_land_during_a_run_start_exactly_one_follow_up(data_stack: OfflineStack) -> None:
    hold_runs_in_a_waiting_machine(data_stack)
    drop(data_stack, "first", WITH_VALIDATION)
    drain(data_stack)
    wait_until(lambda: len(executions(data_stack)) == 1, message="the first run")
    (first,) = executions(data_stack)

    drop(data_stack, "second", range(10, 12))
    drop(data_stack, "third", range(20, 22))
    drain(data_stack)
    assert trigger(data_stack)["reason"] == f"a run holds the lock: {first['name']}"
    assert len(executions(data_stack)) == 1

    after = release_and_look(data_stack, first["name"])

    assert after["started"]
    assert trigger(data_stack)["reason"] == f"a run holds the lock: {after['started']}"
    names = sorted(e["name"] for e in executions(data_stack))
    assert names == sorted([first["name"], after["started"]])
    follow_up = parse_manifest(read(data_stack, f"dataset/manifests/{after['started']}.jsonl").decode())
    assert {e.batch for e in follow_up} == {"first", "second", "third"}, "versions are cumulative"


def test_the_lock_of_a_run_that_was_killed_is_taken_over(data_stack: OfflineStack) -> None:
    hold_runs_in_a_waiting_machine(data_stack)
    drop(data_stack, "first", WITH_VALIDATION)
    drain(data_stack)
    wait_until(lambda: len(executions(data_stack)) == 1, message="the first run")
    (first,) = executions(data_stack)
    data_stack.aws.stepfunctions.stop_execution(executionArn=first["executionArn"])
    drop(data_stack, "second", range(10, 11))

    drain(data_stack)
    wait_until(lambda: len(executions(data_stack)) == 2, message="a second run")

    assert trigger(data_stack)["reason"].startswith("a run holds the lock: ds-")  # type: ignore[union-attr]


@pytest.mark.slow(seconds=205)
def test_a_drop_of_two_thousand_objects_starts_exactly_one_run(data_stack: OfflineStack) -> None:
    # The run holds the lock for an hour: this test is about the intake and the trigger (what a
    # run does is tests/integration/test_retraining_run.py's).
    hold_runs_in_a_waiting_machine(data_stack)
    pair = scene(42)
    for index in range(1000):
        # Distinct images (a duplicate would not count as new data): one byte of JPEG comment.
        image = pair.image[:2] + b"\xff\xfe\x00\x05" + index.to_bytes(3, "big") + pair.image[2:]
        upload(data_stack, f"incoming/big/images/{index:04d}.jpg", image)
        upload(data_stack, f"incoming/big/labels/{index:04d}.png", pair.label)
    upload(data_stack, "incoming/big/_COMPLETE", b"")

    drain(data_stack)
    assert_every_upload_accounted_for_once(data_stack)

    (run,) = executions(data_stack)
    assert run["status"] == "RUNNING"
    assert trigger(data_stack)["reason"] == f"a run holds the lock: {run['name']}", "and no second run starts"
    entries = parse_manifest(read(data_stack, f"dataset/manifests/{run['name']}.jsonl").decode())
    assert len(entries) == 1000
    assert len(executions(data_stack)) == 1


def test_a_corrected_label_uploaded_after_a_run_is_new_data_for_the_next(
    data_stack: OfflineStack,
) -> None:
    drop(data_stack, "fixes", WITH_VALIDATION)
    drain(data_stack)
    wait_until(lambda: len(finished(data_stack)) == 1, timeout=RUN_TIMEOUT, message="the first run")
    assert trigger(data_stack)["reason"] == "no new curated pairs in closed batches"

    upload(data_stack, "incoming/fixes/labels/scene-2.png", scene(4).label)  # a corrected mask
    drain(data_stack)
    # The pair is curated into a closed batch: the intake asks the trigger to look again.
    wait_until(lambda: len(executions(data_stack)) == 2, timeout=RUN_TIMEOUT, message="the second run")
    second = [i.payload for i in data_stack.runtime.invocations if i.function.endswith("TriggerFunction")][-1]

    assert second["started"], second
    assert second["reason"] == "1 new pairs (threshold 1)"
    statuses = sorted(r["status"] for r in fates(data_stack).values() if "scene-2.png" in r["key"])
    assert statuses == ["curated", "superseded"]
    assert_every_upload_accounted_for_once(data_stack)


def test_a_drop_with_no_validation_pair_waits_for_one_before_a_run_starts(data_stack: OfflineStack) -> None:
    drop(data_stack, "train-only", (1, 2))
    drain(data_stack)

    waiting = trigger(data_stack)
    assert waiting["started"] is None
    assert "no pair is in the validation split yet" in str(waiting["reason"])
    assert executions(data_stack) == [], "a model that cannot be judged is not trained"

    drop(data_stack, "with-validation", (3,))
    drain(data_stack)

    wait_until(lambda: len(executions(data_stack)) == 1, message="the run, once a pair can judge it")
