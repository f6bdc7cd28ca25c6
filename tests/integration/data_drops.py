"""What annotation teams upload in these tests: real scenes, drawn small, and the ledger's view."""

from __future__ import annotations

import io
import json
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PIL import Image
from typer.testing import CliRunner

from retrain.cli import app
from retrain.local.cloudformation.stack import OfflineStack
from retrain.synth import draw_scene

SIZE = (96, 48)


@dataclass(frozen=True)
class Pair:
    image: bytes
    label: bytes

    def _replace_label(self, label: bytes) -> Pair:
        return Pair(self.image, label)


def scene(seed: int) -> Pair:
    image, label = draw_scene(SIZE, random.Random(seed))
    return Pair(_encode(image, "JPEG"), _encode(label, "PNG"))


def bad_label(values: list[int]) -> bytes:
    """A mask of the right size holding the given values, one per row band."""
    mask = Image.new("L", SIZE, 0)
    band = SIZE[1] // len(values)
    for index, value in enumerate(values):
        mask.paste(value, (0, index * band, SIZE[0], (index + 1) * band))
    return _encode(mask, "PNG")


def _encode(picture: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


# Every (key, VersionId) a test uploaded, per stack: the intake deletes a landing version for good
# once it is copied, so the bucket alone cannot say what was ever uploaded (as on AWS).
_UPLOADS: weakref.WeakKeyDictionary[OfflineStack, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def upload(stack: OfflineStack, key: str, body: bytes, **extra: Any) -> str:
    """Put one object as an annotator does (`extra`: more PutObject arguments, such as its
    encryption); its VersionId (remembered for the accounting)."""
    version = stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=key, Body=body, **extra)["VersionId"]
    _UPLOADS.setdefault(stack, set()).add((key, version))
    return version


def upload_pair(stack: OfflineStack, batch: str, stem: str, pair: Pair, label_first: bool = False) -> None:
    files = [
        (f"incoming/{batch}/images/{stem}.jpg", pair.image),
        (f"incoming/{batch}/labels/{stem}.png", pair.label),
    ]
    for key, body in reversed(files) if label_first else files:
        upload(stack, key, body)


def drain(stack: OfflineStack) -> int:
    """Deliver everything on the intake queue, as Lambda's poller would; how many messages."""
    (mapping,) = stack.poller.mappings
    delivered = 0
    while received := stack.poller.poll_once(mapping, wait_seconds=0.1).received:
        delivered += received
    return delivered


def fates(stack: OfflineStack) -> dict[tuple[str, str], dict[str, Any]]:
    """Every ledger file record, by (landing key, version)."""
    pages = stack.aws.dynamodb.get_paginator("scan").paginate(TableName=stack.ref("LedgerTable"))
    items = [item for page in pages for item in page["Items"]]
    records = [json.loads(i["record"]["S"]) for i in items if i["sk"]["S"].startswith("file#")]
    return {(r["key"], r["version"]): r for r in records}


def status_by_key(stack: OfflineStack) -> dict[str, str]:
    """The current fate of each landing key (superseded versions left out)."""
    current: dict[str, str] = {}
    for (key, _), record in sorted(fates(stack).items(), key=lambda kv: kv[1]["recorded_at"]):
        if record["status"] != "superseded":
            current[key] = record["status"]
    return current


def landing_versions(stack: OfflineStack) -> set[tuple[str, str]]:
    """The (key, version) pairs under incoming/ now: uploads not yet curated or quarantined."""
    pages = stack.aws.s3.get_paginator("list_object_versions").paginate(
        Bucket=stack.ref("DataBucket"), Prefix="incoming/"
    )
    return {(v["Key"], v["VersionId"]) for page in pages for v in page.get("Versions", [])}


def delete_markers(stack: OfflineStack, prefix: str = "incoming/") -> list[str]:
    pages = stack.aws.s3.get_paginator("list_object_versions").paginate(Bucket=stack.ref("DataBucket"), Prefix=prefix)
    return sorted(m["Key"] for page in pages for m in page.get("DeleteMarkers", []))


def uploads(stack: OfflineStack) -> set[tuple[str, str]]:
    """Every (key, version) this test uploaded with `upload`."""
    return set(_UPLOADS.get(stack, set()))


def _nothing_erased(key: str) -> bool:
    del key
    return False


def assert_every_upload_accounted_for_once(
    stack: OfflineStack, erased: Callable[[str], bool] = _nothing_erased
) -> None:
    """Every upload has exactly one ledger record and nothing else has one; `erased` says which
    landing keys a purge removed (their records are gone by design)."""
    recorded = fates(stack)
    uploaded = {(key, version) for key, version in uploads(stack) if not erased(key)}
    assert landing_versions(stack) <= uploads(stack), "a landing version nobody uploaded"
    missing = uploaded - set(recorded)
    assert not missing, f"{len(missing)} uploads with no ledger record: {sorted(missing)[:5]}"
    unknown = set(recorded) - uploaded
    assert not unknown, f"{len(unknown)} records of nothing uploaded: {sorted(unknown)[:5]}"
    pending = {k for k, r in recorded.items() if r["status"] == "pending"}
    assert not pending, f"{len(pending)} still pending: {sorted(pending)[:5]}"


def executions(stack: OfflineStack) -> list[dict[str, Any]]:
    sfn = stack.aws.stepfunctions
    found: list[dict[str, Any]] = []
    for machine in sfn.list_state_machines()["stateMachines"]:
        found += sfn.list_executions(stateMachineArn=machine["stateMachineArn"])["executions"]
    return found


def wait_until(condition: Any, timeout: float = 20, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(0.05)


def audit(stack: OfflineStack, *args: str) -> tuple[int, dict[str, Any]]:
    """`retrain data audit --json` as an engineer runs it against the stack: its exit code and report."""
    env = {"DATA_BUCKET": stack.ref("DataBucket"), "LEDGER_TABLE": stack.ref("LedgerTable")}
    # A server-mode stack is reached at its endpoint; under mock_aws every client reaches moto.
    endpoint = ["--endpoint-url", stack.endpoint_url] if stack.endpoint_url else []
    result = CliRunner().invoke(app, ["data", "audit", "--json", *endpoint, *args], env=env)
    assert result.exit_code in {0, 1}, result.output
    return result.exit_code, json.loads(result.stdout)


def object_versions(stack: OfflineStack, prefix: str) -> dict[str, list[str]]:
    """Every key under `prefix` with its versions (delete markers as "delete-marker")."""
    pages = stack.aws.s3.get_paginator("list_object_versions").paginate(Bucket=stack.ref("DataBucket"), Prefix=prefix)
    found: dict[str, list[str]] = {}
    for page in pages:
        for version in page.get("Versions", []):
            found.setdefault(version["Key"], []).append(version["VersionId"])
        for marker in page.get("DeleteMarkers", []):
            found.setdefault(marker["Key"], []).append("delete-marker")
    return found
