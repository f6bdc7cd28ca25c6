"""An engineer asks whether the data adds up (`retrain data audit`): every object version has one
fate in the ledger, every record names an object that is there, every manifest line pins the bytes
it says, and no duplicate-detection claim outlives the file it names."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from functions.common.contracts import parse_manifest
from functions.data.ledger import Ledger
from retrain.cli import app
from retrain.local.cloudformation.stack import OfflineStack
from retrain.ops.audit import Kind, audit
from retrain.ops.status import utc_now
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


def hold_runs(stack: OfflineStack) -> None:
    """Runs wait an hour: the trigger freezes a real manifest, and nothing trains meanwhile."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec("retrain-local-TriggerFunction")
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))


def frozen_manifest(stack: OfflineStack) -> str:
    """Deliver the drop and wait for the trigger to freeze its dataset version; the manifest key."""
    drain(stack)
    wait_until(lambda: len(executions(stack)) == 1, message="a run on the frozen dataset version")
    (run,) = executions(stack)
    return f"dataset/manifests/{run['name']}.jsonl"


def cli(stack: OfflineStack, *args: str) -> Any:
    """`retrain data ...` as an engineer runs it, pointed at the stack by its environment."""
    env = {"DATA_BUCKET": stack.ref("DataBucket"), "LEDGER_TABLE": stack.ref("LedgerTable")}
    return CliRunner().invoke(app, ["data", *args], env=env)


def audited(stack: OfflineStack, *args: str) -> tuple[int, dict[str, Any]]:
    """`retrain data audit --json`: its exit code and its report."""
    result = cli(stack, "audit", "--json", *args)
    assert result.exit_code in {0, 1}, result.output
    return result.exit_code, json.loads(result.stdout)


def found(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d["kind"], d["subject"]) for d in report["discrepancies"]]


def put(stack: OfflineStack, key: str, body: bytes) -> None:
    """Write straight into the bucket, past the intake (no notification outside incoming/)."""
    stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=key, Body=body)


def drop(stack: OfflineStack, batch: str, seeds: range) -> None:
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))


def test_a_drop_with_a_rejected_file_a_duplicate_and_a_replaced_photo_audits_clean(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    drop(data_stack, "leipzig", range(4))  # scene-3 lands in the validation split
    drain(data_stack)
    upload(data_stack, "incoming/leipzig/images/broken.jpg", scene(8).image)
    upload(data_stack, "incoming/leipzig/labels/broken.png", bad_label([0, 77]))
    upload_pair(data_stack, "leipzig", "scene-1-again", scene(1))
    upload(data_stack, "incoming/leipzig/_COMPLETE", b"")
    frozen_manifest(data_stack)
    # After the freeze the team replaces a photo: the manifest still pins the curated version it saw.
    upload(data_stack, "incoming/leipzig/images/scene-2.jpg", scene(12).image)
    drain(data_stack)

    # No grace: nothing may hide behind "too recent".
    code, report = audited(data_stack, "--grace-seconds", "0")

    assert (code, found(report), report["clean"]) == (0, [], True), report["discrepancies"]
    checked = report["checked"]
    assert checked["manifests"] == 1 and checked["manifest_lines"] == 4, checked
    # Four pairs, two files each, all hashed: the replaced photo's first version too.
    assert checked["objects_hashed"] == 8, checked
    assert report["too_recent"] == []
    text = cli(data_stack, "audit")
    assert text.exit_code == 0, text.output
    assert "Clean" in text.stdout, text.stdout
    assert f"using bucket {data_stack.ref('DataBucket')} and table {data_stack.ref('LedgerTable')}" in text.stderr


def test_a_file_put_straight_into_the_curated_zone_is_named_once_it_is_no_longer_recent(
    data_stack: OfflineStack,
) -> None:
    upload_pair(data_stack, "jena", "scene-0", scene(0))
    drain(data_stack)
    put(data_stack, "dataset/images/jena/smuggled.jpg", scene(30).image)

    code, report = audited(data_stack)
    assert code == 0, "a copy the intake may be recording right now is not yet a discrepancy"
    assert [t["subject"] for t in report["too_recent"]] == ["dataset/images/jena/smuggled.jpg"]

    code, report = audited(data_stack, "--grace-seconds", "0")

    assert code == 1
    assert found(report) == [("curated-without-record", "dataset/images/jena/smuggled.jpg")]
    text = cli(data_stack, "audit", "--grace-seconds", "0")
    assert text.exit_code == 1
    for shown in ("Curated files no ledger pair names", "dataset/images/jena/smuggled.jpg", "1 discrepancy"):
        assert shown in text.stdout, f"{shown!r} missing from:\n{text.stdout}"


def test_a_manifest_line_whose_sha256_is_not_the_bytes_it_pins_is_named(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    drop(data_stack, "halle", range(4))  # scene-3 lands in the validation split
    upload(data_stack, "incoming/halle/_COMPLETE", b"")
    manifest = frozen_manifest(data_stack)
    bucket = data_stack.ref("DataBucket")
    text = data_stack.aws.s3.get_object(Bucket=bucket, Key=manifest)["Body"].read().decode()
    entries = parse_manifest(text)
    number = 1 + [e.image for e in entries].index("images/halle/scene-1.jpg")
    # Someone rewrites the manifest with another photo's hash on scene-1's line.
    wrong = hashlib.sha256(scene(40).image).hexdigest()
    lines = text.splitlines()
    lines[number - 1] = lines[number - 1].replace(entries[number - 1].image_sha256, wrong)
    put(data_stack, manifest, "\n".join(lines).encode() + b"\n")

    code, report = audited(data_stack, "--grace-seconds", "0")

    assert code == 1
    assert found(report) == [("manifest-sha256-mismatch", f"{manifest}:{number}")]
    (mismatch,) = report["discrepancies"]
    assert "images/halle/scene-1.jpg" in mismatch["detail"] and wrong[:12] in mismatch["detail"]


def test_a_claim_left_by_an_unfinished_erasure_is_named_and_a_purge_of_the_file_removes_it(
    data_stack: OfflineStack,
) -> None:
    upload_pair(data_stack, "gera", "face", scene(50))
    upload_pair(data_stack, "gera", "road", scene(51))
    drain(data_stack)
    table = data_stack.ref("LedgerTable")
    sha = hashlib.sha256(scene(50).image).hexdigest()
    claim = data_stack.aws.dynamodb.get_item(
        TableName=table, Key={"pk": {"S": f"content#{sha}"}, "sk": {"S": "content"}}
    )
    assert cli(data_stack, "purge", "--yes", "gera/face").exit_code == 0
    # An erasure cut short (or one made before erasures followed claims) left the claim behind.
    data_stack.aws.dynamodb.put_item(TableName=table, Item=claim["Item"])

    code, report = audited(data_stack, "--grace-seconds", "0")

    assert code == 1
    assert found(report) == [("claim-of-erased-file", f"content#{sha} content")]
    assert "gera/images/face.jpg" in report["discrepancies"][0]["detail"]
    purged = cli(data_stack, "purge", "--yes", "incoming/gera/images/face.jpg")
    assert purged.exit_code == 0, purged.output
    code, report = audited(data_stack, "--grace-seconds", "0")
    assert (code, found(report)) == (0, []), "the purge left the claim"


def test_an_upload_the_intake_has_not_seen_is_too_recent_then_unprocessed_and_bad_usage_exits_2(
    data_stack: OfflineStack,
) -> None:
    upload(data_stack, "incoming/zwickau/images/late.jpg", scene(60).image)  # never delivered

    code, report = audited(data_stack)
    assert code == 0 and [t["subject"] for t in report["too_recent"]] == ["incoming/zwickau/images/late.jpg"]
    code, report = audited(data_stack, "--grace-seconds", "0")
    assert code == 1 and found(report) == [("unprocessed-upload", "incoming/zwickau/images/late.jpg")]

    negative = cli(data_stack, "audit", "--grace-seconds", "-1")
    assert negative.exit_code == 2, negative.output
    missing = cli(data_stack, "audit", "--bucket", "no-such-bucket")
    assert missing.exit_code == 2 and "no bucket no-such-bucket" in missing.output, missing.output


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands read DATA_BUCKET and LEDGER_TABLE: only what a test passes counts."""
    monkeypatch.delenv("DATA_BUCKET", raising=False)
    monkeypatch.delenv("LEDGER_TABLE", raising=False)


def test_a_quarantined_version_removed_by_the_lifecycle_rule_is_counted_once_old_enough_not_before(
    data_stack: OfflineStack,
) -> None:
    # The bucket's lifecycle rule removes superseded versions under quarantine/ after
    # NoncurrentVersionDays (30): the ledger still names the first quarantined copy of a file that
    # was uploaded, and rejected, twice. Moto runs no lifecycle, so the test removes it as S3 would.
    s3, bucket = data_stack.aws.s3, data_stack.ref("DataBucket")
    for body in (b"first notes", b"second notes"):
        upload(data_stack, "incoming/lyon/images/notes.txt", body)
        drain(data_stack)
    listed = s3.list_object_versions(Bucket=bucket, Prefix="quarantine/lyon/images/notes.txt")["Versions"]
    for key in ("quarantine/lyon/images/notes.txt", "quarantine/lyon/images/notes.txt.reason.json"):
        (superseded,) = [v for v in listed if v["Key"] == key and not v["IsLatest"]]
        s3.delete_object(Bucket=bucket, Key=key, VersionId=superseded["VersionId"])
    ledger = Ledger(data_stack.aws.dynamodb, data_stack.ref("LedgerTable"))

    # Within 30 days of the record, no rule can have removed it: a discrepancy.
    today = audit(ledger, s3, bucket, grace_seconds=0)
    assert [(d.kind, d.version) for d in today.discrepancies] == [
        (Kind.RECORD_WITHOUT_OBJECT, superseded_version(listed))
    ]
    # Later, the rule may have: counted, not flagged.
    later = audit(ledger, s3, bucket, grace_seconds=0, clock=lambda: utc_now() + timedelta(days=31))
    assert (later.clean, later.checked.expired_by_lifecycle) == (True, 1), later.discrepancies


def superseded_version(listed: list[dict[str, Any]]) -> str:
    (version,) = [
        v["VersionId"] for v in listed if v["Key"] == "quarantine/lyon/images/notes.txt" and not v["IsLatest"]
    ]
    return str(version)
