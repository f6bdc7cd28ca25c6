"""An engineer looks at the data (`retrain data status`) and erases a photograph on request
(`retrain data purge`): every version, every zone, the ledger, and every manifest that held it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

from functions.common import clients
from functions.common.contracts import parse_manifest
from functions.data.ledger import Ledger
from retrain.cli import app
from retrain.local.cloudformation.stack import ACCOUNT_ID, LIST_TYPES, OfflineStack, StackOptions
from retrain.local.cloudformation.template import Resolver, load_template
from retrain.ops.purge import LockHeldError, PurgeLease, purge
from tests import iam
from tests.integration.aws_calls import Call, needs, operator_calls
from tests.integration.conftest import DATA
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    bad_label,
    drain,
    executions,
    scene,
    status_by_key,
    upload,
    upload_pair,
    wait_until,
)
from tests.integration.helpers import create_machine
from tests.integration.runs import RUN_TIMEOUT, release_and_look


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
    """`retrain data ...` as an engineer runs it, pointed at the stack by its environment (and a
    server-mode stack's endpoint; under mock_aws every client reaches moto)."""
    env = {"DATA_BUCKET": stack.ref("DataBucket"), "LEDGER_TABLE": stack.ref("LedgerTable")}
    endpoint = ["--endpoint-url", stack.endpoint_url] if stack.endpoint_url else []
    return CliRunner().invoke(app, ["data", *args, *endpoint], env=env)


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


def erasure_role_refusals(stack: OfflineStack, calls: list[Call]) -> list[str]:
    """The calls of a purge that ErasureRole's statements, or the bucket policy, would refuse on
    AWS (offline nothing is refused: moto enforces neither)."""
    return role_refusals(stack, calls, "ErasureRole")


def role_refusals(stack: OfflineStack, calls: list[Call], logical_id: str) -> list[str]:
    """The calls of an operator's command that the role's statements, or the bucket policy, would
    refuse on AWS. STS answers GetCallerIdentity to any credentials: it needs no grant."""
    calls = [call for call in calls if (call.service, call.operation) != ("sts", "GetCallerIdentity")]
    body = load_template(stack.options.template).body
    resolver = Resolver(
        stack.options.stack_name,
        stack.options.region,
        ACCOUNT_ID,
        stack.created.parameters,
        dict(stack.created.resources),
        list_parameters=frozenset(
            name for name, spec in body["Parameters"].items() if str(spec["Type"]).startswith(LIST_TYPES)
        ),
        condition_definitions=body["Conditions"],
        mappings=body["Mappings"],
    )
    statements = iam.statements_of(body, logical_id, resolver)
    bucket_policy = iam.resource_policy(
        resolver.resolve(body["Resources"]["DataBucketPolicy"]["Properties"])["PolicyDocument"]
    )
    role = str(resolver.resolve({"Fn::GetAtt": [logical_id, "Arn"]}))  # its RoleName, as deployed
    key = stack.resource("DataKey").attributes["Arn"]
    refused = {
        f"{call.service}.{call.operation} needs {need}"
        for call in calls
        for need in needs(call, region=stack.options.region, account=ACCOUNT_ID, key_arn=key)
        if not iam.allowed(statements, need) or iam.denied_by(bucket_policy, role, need)
    }
    return sorted(refused)


def test_an_erased_pair_is_gone_from_every_zone_version_manifest_and_the_ledger(
    data_stack: OfflineStack, monkeypatch: pytest.MonkeyPatch
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
    # Where a stack deployed before issue 28 kept the batch's report: it names the file too.
    legacy = ("reports/munich/report.json", "reports/munich/report.md")
    for key in legacy:
        data_stack.aws.s3.put_object(Bucket=data_stack.ref("DataBucket"), Key=key, Body=b"scene-0.jpg rejected")

    with operator_calls(monkeypatch) as calls:
        result = cli(data_stack, "purge", "--yes", image, "--json")

    assert result.exit_code == 0, result.output
    assert erasure_role_refusals(data_stack, calls) == [], "calls ErasureRole would be refused on AWS"
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
    batch_report = json.loads(read(data_stack, "reports/batches/munich/report.json"))
    assert batch_report["accepted"] == ["scene-1", "scene-2", "scene-3"], "the batch report was not rewritten"
    assert len(versions(data_stack, "reports/batches/munich/report.json")) == 1
    assert [key for key in legacy if versions(data_stack, key)] == [], "the report's old place still names it"
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
        "--yes",
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


def test_a_refused_upload_left_in_the_landing_zone_is_erased_with_its_lone_reason(data_stack: OfflineStack) -> None:
    # Encrypted otherwise than with the stack's key: refused where it lies, its reason in quarantine/.
    other_key = data_stack.aws.kms.create_key()["KeyMetadata"]["Arn"]
    upload(
        data_stack, "incoming/b1/images/face.jpg", scene(5).image, ServerSideEncryption="aws:kms", SSEKMSKeyId=other_key
    )
    upload(data_stack, "incoming/b1/labels/face.png", scene(5).label)
    upload(data_stack, "incoming/b1/face-notes.txt", b"the driver's name", ServerSideEncryption="AES256")
    drain(data_stack)
    assert status_by_key(data_stack)["incoming/b1/images/face.jpg"] == "refused"
    assert status_by_key(data_stack)["incoming/b1/face-notes.txt"] == "refused"

    result = cli(data_stack, "purge", "--yes", "b1/face", "incoming/b1/face-notes.txt", "--json")

    assert result.exit_code == 0, result.output
    left = sorted(k for k, _ in versions(data_stack) if k.rpartition("/")[2].startswith("face"))
    assert left == [], f"still in the bucket: {left}"
    mentions = [item["sk"]["S"] for item in ledger_items(data_stack) if "face" in json.dumps(item)]
    assert mentions == [], f"the ledger still holds the erased files: {mentions}"
    audited = cli(data_stack, "audit", "--grace-seconds", "0")
    assert audited.exit_code == 0, audited.output


def claimants(stack: OfflineStack) -> dict[str, str]:
    """The content index: which file first claimed each image sha256."""
    return {i["pk"]["S"].removeprefix("content#"): i["key"]["S"] for i in ledger_items(stack) if "key" in i}


def test_an_image_replaced_after_curation_is_erased_with_the_claims_of_both_its_versions(
    data_stack: OfflineStack,
) -> None:
    # Dresden uploaded a street photo with its label, then replaced the photo with another one.
    street, replacement = scene(20), scene(21)
    upload_pair(data_stack, "dresden", "street", street)
    drain(data_stack)
    upload(data_stack, "incoming/dresden/images/street.jpg", replacement.image)
    drain(data_stack)
    assert len(versions(data_stack, "dataset/images/dresden/street.jpg")) == 2, "both photos were curated"
    claimed = [sha for sha, key in claimants(data_stack).items() if key == "dresden/images/street.jpg"]
    assert len(claimed) == 2, f"each photo's bytes are claimed by the street: {claimed}"

    result = cli(data_stack, "purge", "--yes", "dresden/street", "--json")

    assert result.exit_code == 0, result.output
    left = {sha: key for sha, key in claimants(data_stack).items() if key == "dresden/images/street.jpg"}
    assert left == {}, f"the erased street still claims these bytes: {left}"
    assert versions(data_stack, "dataset/images/dresden/") == set(), "a version of the photo is still there"
    again = cli(data_stack, "purge", "--yes", "dresden/street")
    assert again.exit_code == 1 and "matched nothing" in again.output, again.output

    # Later the first photo comes back under another name: it is new data, not a copy of the erased one.
    upload_pair(data_stack, "dresden", "avenue", street)
    drain(data_stack)
    assert status_by_key(data_stack)["incoming/dresden/images/avenue.jpg"] == "curated"
    assert claimants(data_stack)[hashlib.sha256(street.image).hexdigest()] == "dresden/images/avenue.jpg"


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

    some = cli(data_stack, "purge", "--yes", "bonn/scene-0", "bonn/no-such-scene")
    assert some.exit_code == 1, some.output
    assert "matched nothing: bonn/no-such-scene" in some.output
    assert not [k for k, _ in versions(data_stack) if "/scene-0." in k], "the match was not erased"

    again = cli(data_stack, "purge", "--yes", "bonn/scene-0")
    assert again.exit_code == 1, f"a second purge of the same pair should match nothing: {again}"

    for unusable in ("dataset/manifests/x.jsonl", "reports/bonn/report.json", "scene-1"):
        refused = cli(data_stack, "purge", "--yes", unusable)
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


# ------------------------------------------------------------ purges and the trigger's lock --
TRIGGER = "retrain-local-TriggerFunction"


def hold_runs(stack: OfflineStack) -> str:
    """Runs wait an hour (each holds the lock until its Finish, played by the test, releases it)."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec(TRIGGER)
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))
    return machine


def trigger(stack: OfflineStack, **event: str) -> dict[str, Any]:
    invocation = stack.runtime.invoke(TRIGGER, event)
    assert not invocation.failed, invocation.payload
    return invocation.payload  # type: ignore[no-any-return]


def finish(stack: OfflineStack, run: str) -> None:
    """What the run's last state does: release its lock and look for new data."""
    release_and_look(stack, run)


def ledger_of(stack: OfflineStack) -> Ledger:
    return Ledger(stack.aws.dynamodb, stack.ref("LedgerTable"))


def a_running_run(stack: OfflineStack, batch: str, seeds: range) -> str:
    """A drop whose marker starts a run that holds the lock; the run's name."""
    drop(stack, batch, seeds)
    drain(stack)
    wait_until(lambda: len(executions(stack)) == 1, message="a run holding the lock")
    (run,) = executions(stack)
    return str(run["name"])


def manifest_versions(stack: OfflineStack) -> dict[tuple[str, str], list[str]]:
    """Every version of every manifest, by (key, version id): the images it lists."""
    bucket = stack.ref("DataBucket")
    listed = {(k, v) for k, v in versions(stack, "dataset/manifests/") if k.endswith(".jsonl")}
    found = {}
    for key, version in sorted(listed):
        body = stack.aws.s3.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"].read()
        found[(key, version)] = [entry.image for entry in parse_manifest(body.decode())]
    return found


def test_a_purge_while_a_run_holds_the_lock_is_refused_and_changes_nothing(data_stack: OfflineStack) -> None:
    hold_runs(data_stack)
    run = a_running_run(data_stack, "ulm", range(4))  # scene-3 lands in the validation split
    bucket_before, ledger_before = versions(data_stack), ledger_items(data_stack)

    refused = cli(data_stack, "purge", "--yes", "ulm/scene-1")

    assert refused.exit_code == 1, refused.output
    for said in (f"run {run} holds the retraining lock", "nothing was changed", "retry after the run ends", "--wait"):
        assert said in refused.output, f"{said!r} missing from: {refused.output}"
    assert versions(data_stack) == bucket_before, "a refused purge changed the bucket"
    assert ledger_items(data_stack) == ledger_before, "a refused purge changed the ledger (or the lock)"
    dry = cli(data_stack, "purge", "ulm/scene-1", "--dry-run", "--json")
    assert dry.exit_code == 0, "a dry run needs no lock"
    assert any(f"run {run} holds the retraining lock" in w for w in json.loads(dry.stdout)["warnings"])

    finish(data_stack, run)
    erased = cli(data_stack, "purge", "--yes", "ulm/scene-1")

    assert erased.exit_code == 0, erased.output
    assert "images/ulm/scene-1.jpg" not in manifest_images(data_stack, run)
    lock = ledger_of(data_stack).lock()
    assert lock is not None and lock.holder.startswith("purge:"), "the purge held the lock"
    assert lock.expires_at <= datetime.now(UTC), "and let its lease lapse when it was done"


def test_a_purge_told_to_wait_erases_as_soon_as_the_run_releases_the_lock(data_stack: OfflineStack) -> None:
    hold_runs(data_stack)
    run = a_running_run(data_stack, "jena", range(4))
    waited_for: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            purge,
            ledger_of(data_stack),
            data_stack.aws.s3,
            data_stack.ref("DataBucket"),
            ["jena/scene-2"],
            wait=True,
            on_wait=lambda lock: waited_for.append(lock.holder),
            poll_seconds=0.05,
        )
        wait_until(lambda: len(waited_for) >= 3, message="the purge waiting for the run")
        assert not waiting.done() and "images/jena/scene-2.jpg" in manifest_images(data_stack, run)

        finish(data_stack, run)
        report = waiting.result(timeout=60)

    assert set(waited_for) == {run}
    assert [p.stem for p in report.pairs] == ["scene-2"] and report.remaining == []
    assert "images/jena/scene-2.jpg" not in manifest_images(data_stack, run)


def test_a_lock_left_by_a_stopped_run_holds_a_purge_back_only_until_it_may_ask_step_functions(
    data_stack: OfflineStack,
) -> None:
    machine = hold_runs(data_stack)
    run = a_running_run(data_stack, "gotha", range(4))
    # Someone stops the run in the console: no Finish state runs, so its lease stays for days.
    (execution,) = executions(data_stack)
    data_stack.aws.stepfunctions.stop_execution(executionArn=execution["executionArn"])
    wait_until(lambda: executions(data_stack)[0]["status"] == "ABORTED", message="the run stopped")

    blind = cli(data_stack, "purge", "--yes", "gotha/scene-0")
    assert blind.exit_code == 1 and f"run {run} holds the retraining lock" in blind.output, blind.output

    told = CliRunner().invoke(
        app,
        ["data", "purge", "--yes", "gotha/scene-0"],
        env={
            "DATA_BUCKET": data_stack.ref("DataBucket"),
            "LEDGER_TABLE": data_stack.ref("LedgerTable"),
            "STATE_MACHINE_ARN": machine,
        },
    )

    assert told.exit_code == 0, told.output
    assert "images/gotha/scene-0.jpg" not in manifest_images(data_stack, run)


def test_the_trigger_does_not_freeze_while_a_purge_holds_the_lock_and_freezes_after(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    drop(data_stack, "erfurt", range(4))
    # A purge is at work (as `purge` holds it between its steps) when the drop's marker kicks the trigger.
    lease = PurgeLease.take(ledger_of(data_stack), clock=lambda: datetime.now(UTC))
    drain(data_stack)
    wait_until(lambda: any(i.function == TRIGGER for i in data_stack.runtime.invocations), message="the marker's kick")
    (kicked,) = [i.payload for i in data_stack.runtime.invocations if i.function == TRIGGER]
    assert kicked["started"] is None and lease.record.holder in kicked["reason"], kicked
    assert trigger(data_stack)["started"] is None, "a look on schedule waits for the purge too"
    assert executions(data_stack) == [] and manifest_versions(data_stack) == {}

    lease.end()
    looked = trigger(data_stack)

    assert looked["started"], looked
    assert [e["name"] for e in executions(data_stack)] == [looked["started"]]
    assert len(manifest_images(data_stack, looked["started"])) == 4


class PauseBefore:
    """Holds the thread of the clients it is put on before the first AWS call `where` picks (by its
    index among their calls, operation and parameters), until the other side has had its turn."""

    def __init__(self, where: Callable[[int, str, dict[str, Any]], bool]) -> None:
        self.where = where
        self.reached, self.resume = threading.Event(), threading.Event()
        self._calls = 0

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        index, self._calls = self._calls, self._calls + 1
        if not self.reached.is_set() and self.where(index, model.name, params):
            self.reached.set()
            assert self.resume.wait(timeout=60), "nobody let the paused side go on"

    @contextmanager
    def on(self, *aws_clients: Any) -> Iterator[PauseBefore]:
        for client in aws_clients:
            client.meta.events.register("before-parameter-build", self, unique_id=f"pause-{id(self)}")
        try:
            yield self
        finally:
            self.resume.set()
            for client in aws_clients:
                client.meta.events.unregister("before-parameter-build", unique_id=f"pause-{id(self)}")


def erase_if_free(ledger: Ledger, s3: Any, bucket: str, batch: str) -> bool:
    """Purge the round's `erased` pair; False if a run held the lock (nothing was changed)."""
    try:
        purge(ledger, s3, bucket, [f"{batch}/erased"])
    except LockHeldError:
        return False
    return True


def while_paused(pause: PauseBefore, paused: Callable[[], T], other: Callable[[], U]) -> tuple[T, U]:
    """Run `paused` in a thread; when it reaches the pause (or ends without reaching it), `other`
    here; then let the first go on."""
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(paused)
        wait_until(lambda: pause.reached.is_set() or first.done(), message="the paused side at its pause")
        second = other()
        pause.resume.set()
        return first.result(timeout=60), second


# Where a purge is when the trigger looks: before each step that reads or erases.
PURGE_MOMENTS: dict[str, Callable[[int, str, dict[str, Any]], bool]] = {
    "before it looks at the lock": lambda index, _, __: index == 0,
    "as it reads the manifests": lambda _, op, params: (
        op == "ListObjectVersions" and params.get("Prefix") == "dataset/manifests/"
    ),
    "as it erases the ledger's items": lambda _, op, __: op == "DeleteItem",
    "as it deletes the objects": lambda _, op, __: op == "DeleteObjects",
    "as it rewrites a manifest": lambda _, op, params: (
        op == "PutObject" and str(params.get("Key", "")).startswith("dataset/manifests/")
    ),
}
# The trigger's look (lock, batches, pairs, taking the lock, the manifest, the run, marking the
# pairs): the purge runs whole before each of these calls in turn.
TRIGGER_CALLS = range(10)
FREE_ROUNDS = 6  # and a few with neither paused, started a few milliseconds apart
T = TypeVar("T")
U = TypeVar("U")


def test_a_purge_racing_a_freeze_never_leaves_an_erased_pair_in_any_manifest(data_stack: OfflineStack) -> None:
    hold_runs(data_stack)
    # The test starts the trigger itself, against the purge; no marker kicks it.
    data_stack.update_function_environment("IntakeFunction", TRIGGER_FUNCTION="")
    drop(data_stack, "base", range(4))  # scene-3 lands in the validation split
    drain(data_stack)
    finish(data_stack, str(trigger(data_stack)["started"]))
    bucket = data_stack.ref("DataBucket")
    jitter = random.Random(7)
    erased: set[str] = set()
    outcomes: Counter[str] = Counter()
    rounds = [("purge", name) for name in PURGE_MOMENTS]
    rounds += [("trigger", f"before its call {number}") for number in TRIGGER_CALLS]
    rounds += [("neither", f"free {number}") for number in range(FREE_ROUNDS)]

    for number, (paused, moment) in enumerate(rounds):
        batch = f"round-{number}"
        upload_pair(data_stack, batch, "kept", scene(200 + 2 * number))
        upload_pair(data_stack, batch, "erased", scene(201 + 2 * number))
        upload(data_stack, f"incoming/{batch}/_COMPLETE", b"")
        drain(data_stack)
        look = partial(trigger, data_stack)
        if paused == "purge":
            # The purge with clients of its own, paused at the moment; the trigger looks then.
            s3, dynamodb = clients.make("s3"), clients.make("dynamodb")
            table = data_stack.ref("LedgerTable")
            with PauseBefore(PURGE_MOMENTS[moment]).on(s3, dynamodb) as pause:
                purged, looked = while_paused(
                    pause, partial(erase_if_free, Ledger(dynamodb, table), s3, bucket, batch), look
                )
        elif paused == "trigger":
            # The trigger's own clients (cached in this process, as in its Lambda), paused before
            # its call; the purge runs whole meanwhile.
            at = int(moment.rsplit(" ", 1)[1])
            trigger_clients = (clients.dynamodb(), clients.s3(), clients.stepfunctions())
            erase = partial(erase_if_free, ledger_of(data_stack), data_stack.aws.s3, bucket, batch)
            with PauseBefore(lambda index, _, __, at=at: index == at).on(*trigger_clients) as pause:
                looked, purged = while_paused(pause, look, erase)
        else:
            start = threading.Barrier(2)
            with ThreadPoolExecutor(2) as pool:
                froze = pool.submit(at_once, start, jitter.uniform(0, 0.05), look)
                erasing = pool.submit(
                    at_once,
                    start,
                    jitter.uniform(0, 0.05),
                    partial(erase_if_free, ledger_of(data_stack), data_stack.aws.s3, bucket, batch),
                )
                looked, purged = froze.result(), erasing.result()
        started = looked["started"]
        outcomes["purged first" if purged else "froze first"] += 1
        if purged:
            erased.add(f"images/{batch}/erased.jpg")
        listed = {image for images in manifest_versions(data_stack).values() for image in images}
        assert not listed & erased, f"{paused} paused {moment}: a manifest lists {sorted(listed & erased)}"
        # Whichever lost goes again, once the other is done.
        if started:
            finish(data_stack, started)
        if not purged:
            assert erase_if_free(ledger_of(data_stack), data_stack.aws.s3, bucket, batch)
            erased.add(f"images/{batch}/erased.jpg")
        if not started:
            finish(data_stack, str(trigger(data_stack)["started"]))

        listed = {image for images in manifest_versions(data_stack).values() for image in images}
        assert not listed & erased, f"{paused} paused {moment}: a manifest lists {sorted(listed & erased)}"
        assert f"images/{batch}/kept.jpg" in listed, f"{paused} paused {moment}: the kept pair was never frozen"

    assert set(outcomes) == {"purged first", "froze first"}, outcomes


def at_once(start: threading.Barrier, delay: float, work: Callable[[], T]) -> T:
    """`work`, started with the other thread at `start`, after a few milliseconds of `delay`."""
    start.wait()
    time.sleep(delay)
    return work()
