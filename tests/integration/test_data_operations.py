"""An engineer looks at the data (`retrain data status`) and erases a photograph on request
(`retrain data purge`): every version, every zone, the ledger, and every manifest that held it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from functions.common.contracts import parse_manifest
from retrain.cli import app
from retrain.local.stack import OfflineStack, StackOptions
from tests.integration.conftest import DATA
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    bad_label,
    drain,
    executions,
    scene,
    upload,
    upload_pair,
    wait_until,
)
from tests.integration.helpers import create_machine
from tests.integration.runs import RUN_TIMEOUT


def drop(stack: OfflineStack, batch: str, seeds: range) -> None:
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))
    upload(stack, f"incoming/{batch}/_COMPLETE", b"")


def finish_runs(stack: OfflineStack, count: int) -> list[str]:
    """Deliver the uploads and wait until `count` runs have finished; their dataset versions."""
    drain(stack)
    wait_until(
        lambda: sum(e["status"] != "RUNNING" for e in executions(stack)) == count,
        timeout=RUN_TIMEOUT,
        message=f"{count} finished runs",
    )
    return sorted(e["name"] for e in executions(stack))


def cli(stack: OfflineStack, *args: str) -> Any:
    """`retrain data ...` as an engineer runs it, pointed at the stack by its environment."""
    env = {"DATA_BUCKET": stack.ref("DataBucket"), "LEDGER_TABLE": stack.ref("LedgerTable")}
    return CliRunner().invoke(app, ["data", *args], env=env)


def versions(stack: OfflineStack, prefix: str = "") -> set[tuple[str, str]]:
    """Every (key, version id) in the bucket, delete markers included."""
    pages = stack.aws.s3.get_paginator("list_object_versions").paginate(Bucket=stack.ref("DataBucket"), Prefix=prefix)
    return {
        (item["Key"], item["VersionId"])
        for page in pages
        for kind in ("Versions", "DeleteMarkers")
        for item in page.get(kind, [])  # type: ignore[attr-defined]
    }


def ledger_items(stack: OfflineStack) -> list[dict[str, Any]]:
    pages = stack.aws.dynamodb.get_paginator("scan").paginate(TableName=stack.ref("LedgerTable"))
    return [item for page in pages for item in page["Items"]]


def read(stack: OfflineStack, key: str) -> bytes:
    return stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()


def manifest_images(stack: OfflineStack, version: str) -> list[str]:
    text = read(stack, f"dataset/manifests/{version}.jsonl").decode()
    return [entry.image for entry in parse_manifest(text)]


def test_an_erased_pair_is_gone_from_every_zone_version_manifest_and_the_ledger(
    data_stack: OfflineStack,
) -> None:
    # The annotators first uploaded the wrong picture as scene-0, then the right one.
    upload(data_stack, "incoming/munich/images/scene-0.jpg", scene(100).image)
    drain(data_stack)
    drop(data_stack, "munich", range(4))  # scene-3 lands in the validation split
    first = finish_runs(data_stack, 1)
    drop(data_stack, "berlin", range(10, 11))
    both = finish_runs(data_stack, 2)
    image = "incoming/munich/images/scene-0.jpg"
    assert versions(data_stack, image) == set(), "the landing zone keeps no version it judged"
    assert all("images/munich/scene-0.jpg" in manifest_images(data_stack, v) for v in both)

    result = cli(data_stack, "purge", image, "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["unmatched"] == [] and report["remaining"] == [], report
    left = sorted(key for key, _ in versions(data_stack) if "/scene-0." in key)
    assert left == [], f"versions of the erased pair are still in the bucket: {left}"
    mentions = [
        (item["pk"]["S"], item["sk"]["S"])
        for item in ledger_items(data_stack)
        if "scene-0" in json.dumps(item) and "batch#munich" in item["pk"]["S"]
    ]
    assert mentions == [], f"the ledger still holds the erased pair: {mentions}"
    claims = [i["key"]["S"] for i in ledger_items(data_stack) if i["pk"]["S"].startswith("content#")]
    assert "images/scene-0.jpg" not in claims, "the content index still claims the erased image"
    for version in both:
        manifest = f"dataset/manifests/{version}.jsonl"
        images = manifest_images(data_stack, version)
        assert "images/munich/scene-0.jpg" not in images, f"{manifest} still lists the pair"
        assert "images/munich/scene-1.jpg" in images, f"{manifest} lost a pair nobody erased"
        assert len(versions(data_stack, manifest)) == 1, f"{manifest} kept an older version"
        record = json.loads(read(data_stack, f"dataset/manifests/{version}.purged.json"))
        (erasure,) = record["erasures"]
        assert [e["image"] for e in erasure["entries"]] == ["images/munich/scene-0.jpg"]
        assert erasure["erased_at"].startswith(report["at"][:10])
    batch_report = json.loads(read(data_stack, "reports/munich/report.json"))
    assert batch_report["accepted"] == ["scene-1", "scene-2", "scene-3"], "the batch report was not rewritten"
    assert len(versions(data_stack, "reports/munich/report.json")) == 1
    assert read(data_stack, "dataset/images/munich/scene-1.jpg"), "a neighbour was erased"
    assert first[0] in both, "the first run's dataset version is gone"
    assert_every_upload_accounted_for_once(data_stack, erased=lambda key: "/scene-0." in key)


def test_a_rejected_pair_a_stray_file_and_a_copy_of_a_photo_elsewhere_are_erased_too(
    data_stack: OfflineStack,
) -> None:
    upload_pair(data_stack, "b1", "face", scene(5))
    upload(data_stack, "incoming/b1/images/plate.jpg", scene(6).image)
    upload(data_stack, "incoming/b1/labels/plate.png", bad_label([0, 77]))
    upload(data_stack, "incoming/b1/face-notes.txt", b"the driver's name and address")
    upload_pair(data_stack, "b2", "same-face", scene(5))  # a duplicate of b1/face
    drain(data_stack)
    copy = "quarantine/b2/images/same-face.jpg"
    assert copy in {k for k, _ in versions(data_stack)}, "the copy was not set aside"

    result = cli(
        data_stack,
        "purge",
        "quarantine/b1/labels/plate.png.reason.json",
        "b1/face",
        "incoming/b1/face-notes.txt",
        "--json",
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    whys = {(p["batch"], p["stem"] or p["key"]): p["why"] for p in report["pairs"]}
    assert whys == {
        ("b1", "plate"): "requested",
        ("b1", "face"): "requested",
        ("b1", "incoming/b1/face-notes.txt"): "requested",
        ("b2", "same-face"): "same image bytes as b1/face",
    }, f"not the pairs expected, or not for the reason expected: {whys}"
    erased = {"plate", "face", "same-face", "face-notes"}
    left = sorted(k for k, _ in versions(data_stack) if k.rpartition("/")[2].split(".")[0] in erased)
    assert left == [], f"still in the bucket: {left}"
    claims = [i for i in ledger_items(data_stack) if i["pk"]["S"].startswith("content#")]
    assert claims == [], f"the content index still claims the erased photo: {claims}"
    assert_every_upload_accounted_for_once(
        data_stack, erased=lambda key: key.rpartition("/")[2].split(".")[0] in erased
    )


def test_a_dry_run_says_what_it_would_erase_and_changes_nothing(
    data_stack: OfflineStack,
) -> None:
    drop(data_stack, "hamburg", range(4))  # scene-3 lands in the validation split
    (version,) = finish_runs(data_stack, 1)
    bucket_before, ledger_before = versions(data_stack), ledger_items(data_stack)

    result = cli(data_stack, "purge", "dataset/images/hamburg/scene-1.jpg", "--dry-run", "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["dry_run"] is True
    would = {o["key"] for o in report["objects"]}
    # The landing copies were deleted (by version) once curated: only the curated pair is left.
    assert {
        "dataset/images/hamburg/scene-1.jpg",
        "dataset/labels/hamburg/scene-1.png",
    } <= would, would
    assert "batch#hamburg pair#scene-1" in report["ledger_items"]
    (change,) = report["manifests"]
    assert change["dataset_version"] == version
    assert change["entries_removed"] == ["images/hamburg/scene-1.jpg"]
    assert versions(data_stack) == bucket_before, "a dry run changed the bucket"
    assert ledger_items(data_stack) == ledger_before, "a dry run changed the ledger"

    table = cli(data_stack, "purge", "hamburg/scene-1", "--dry-run")
    assert table.exit_code == 0, table.output
    assert "Would erase" in table.output and "nothing was changed" in table.output


def test_keys_that_match_nothing_or_name_nothing_erasable_say_so_in_the_exit_code(
    data_stack: OfflineStack,
) -> None:
    drop(data_stack, "bonn", range(2))
    drain(data_stack)

    some = cli(data_stack, "purge", "bonn/scene-0", "bonn/no-such-scene")
    assert some.exit_code == 1, some.output
    assert "matched nothing: bonn/no-such-scene" in some.output
    assert not [k for k, _ in versions(data_stack) if "/scene-0." in k], "the match was not erased"

    again = cli(data_stack, "purge", "bonn/scene-0")
    assert again.exit_code == 1, f"a second purge of the same pair should match nothing: {again}"

    for unusable in ("dataset/manifests/x.jsonl", "reports/bonn/report.json", "scene-1"):
        refused = cli(data_stack, "purge", unusable)
        assert refused.exit_code == 2, f"{unusable}: {refused.output}"
    assert any("/scene-1." in k for k, _ in versions(data_stack)), "a refused purge erased data"

    nowhere = CliRunner().invoke(app, ["data", "status"], env={"DATA_BUCKET": "", "LEDGER_TABLE": ""})
    assert nowhere.exit_code == 2 and "retrain local up" in nowhere.output, nowhere.output
    missing = cli(data_stack, "status", "--bucket", "no-such-bucket")
    assert missing.exit_code == 2 and "no bucket no-such-bucket" in missing.output, missing.output


def test_status_shows_batches_their_outcomes_waiting_pairs_and_the_run_holding_the_lock(
    data_stack: OfflineStack,
) -> None:
    # Runs wait an hour: the first one holds the lock while the engineer looks.
    from dataclasses import replace  # noqa: PLC0415

    machine = create_machine(data_stack, "waits_an_hour.asl.json")
    spec = data_stack.runtime.spec("retrain-local-TriggerFunction")
    data_stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))
    upload(data_stack, "incoming/koeln/images/broken.jpg", scene(8).image)
    upload(data_stack, "incoming/koeln/labels/broken.png", bad_label([0, 77]))
    drop(data_stack, "koeln", range(2, 4))  # scene-3 lands in the validation split
    upload(data_stack, "incoming/aachen/images/lonely.jpg", scene(9).image)
    upload(data_stack, "incoming/aachen/notes.txt", b"uploaded by mistake")
    drain(data_stack)
    wait_until(lambda: len(executions(data_stack)) == 1, message="a run holding the lock")
    (run,) = executions(data_stack)

    result = cli(data_stack, "status", "--json")

    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    batches = {b["batch"]: b for b in status["batches"]}
    assert batches["koeln"]["status"] == "closed" and batches["koeln"]["closed_by"] == "marker"
    assert batches["koeln"]["files"] == {"curated": 4, "marker": 1, "quarantined": 2}
    assert batches["koeln"]["pairs"] == {"invalid": 1, "valid": 2}
    aachen = batches["aachen"]
    assert aachen["status"] == "open" and aachen["files"] == {"pending": 1, "quarantined": 1}
    assert aachen["last_seen"] > aachen["first_seen"], f"the second upload is not seen: {aachen}"
    assert [(p["batch"], p["stem"], p["waiting_for"]) for p in status["pending_pairs"]] == [
        ("aachen", "lonely", "label")
    ]
    assert status["lock"]["holder"] == run["name"] and status["lock"]["expired"] is False
    assert [v["version"] for v in status["dataset_versions"]] == [run["name"]]

    table = cli(data_stack, "status")
    assert table.exit_code == 0, table.output
    for shown in ("koeln", "aachen", "lonely", f"held by {run['name']}", run["name"]):
        assert shown in table.output, f"{shown!r} missing from:\n{table.output}"


def test_an_engineer_reaches_the_offline_stack_by_its_endpoint_without_credentials() -> None:
    options = StackOptions(mode="server", parameters=DATA, poll=False, tick=False)
    with OfflineStack(options) as stack:
        assert stack.endpoint_url is not None
        environment = {name: value for name, value in os.environ.items() if not name.startswith(("AWS_", "MOTO_"))}
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "retrain.cli",
                "data",
                "status",
                "--endpoint-url",
                stack.endpoint_url,
                "--bucket",
                stack.ref("DataBucket"),
                "--ledger-table",
                stack.ref("LedgerTable"),
                "--json",
            ],
            capture_output=True,
            text=True,
            env={
                **environment,
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            },
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["batch_count"] == 0 and status["lock"] is None


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands read DATA_BUCKET and LEDGER_TABLE: only what a test passes counts."""
    monkeypatch.delenv("DATA_BUCKET", raising=False)
    monkeypatch.delenv("LEDGER_TABLE", raising=False)
