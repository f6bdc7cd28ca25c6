"""S3 and DynamoDB throttle in bursts when a team uploads thousands of files: nothing is lost.

Reads are throttled on the wire (`Throttler`, a before-send hook); writes where they really stop,
inside moto's backends (`retrain.local.endpoint.faults`): a throttled write must not have happened.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from functions.common import clients
from retrain.cli import app
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.endpoint.faults import Throttle, WriteThrottler
from tests.integration.conftest import DATA
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    drain,
    executions,
    landing_versions,
    scene,
    status_by_key,
    upload,
    upload_pair,
    wait_until,
)
from tests.integration.helpers import create_machine, queue_depth

# What the services answer when they throttle: DynamoDB (JSON protocol) and S3 (XML, 503).
THROTTLED = {
    "dynamodb": (
        400,
        b'{"__type":"ThrottlingException","message":"Rate exceeded"}',
    ),
    "s3": (
        503,
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ),
}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class Throttler:
    """Answers the first `times` calls of each operation with a throttling error, on the wire
    level (before-send), so botocore's own retry logic sees them as it would on AWS.

    botocore calls every before-send handler and uses the first answer, so moto still executes
    a throttled request behind our answer. Only operations for which that changes nothing are
    throttled here (reads, and a copy that is repeated anyway); a throttled conditional write
    would have happened after all, which AWS never does."""

    def __init__(self, operations: set[str], times: int) -> None:
        self.operations = operations
        self.times = times
        self.throttled: Counter[str] = Counter()

    def __call__(self, request: Any, **kwargs: Any) -> AWSResponse | None:
        event_name: str = kwargs["event_name"]  # before-send.<service>.<Operation>
        _, service, operation = event_name.split(".")
        name = f"{service}.{operation}"
        if name not in self.operations or self.throttled[name] >= self.times:
            return None
        self.throttled[name] += 1
        status, body = THROTTLED[service]
        return AWSResponse(request.url, status, {}, _Raw(body))


@pytest.fixture
def throttler(data_stack: OfflineStack) -> Iterator[Throttler]:
    throttle = Throttler({"dynamodb.GetItem", "s3.CopyObject", "s3.GetObject"}, times=2)
    assert boto3.DEFAULT_SESSION is not None
    boto3.DEFAULT_SESSION.events.register_first("before-send", throttle, unique_id="throttler")
    yield throttle
    boto3.DEFAULT_SESSION.events.unregister("before-send", unique_id="throttler")


def test_throttled_s3_and_dynamodb_calls_are_retried_and_nothing_is_lost(
    data_stack: OfflineStack, throttler: Throttler
) -> None:
    upload_pair(data_stack, "burst", "scene", scene(7))

    drain(data_stack)

    assert throttler.throttled == {"dynamodb.GetItem": 2, "s3.CopyObject": 2, "s3.GetObject": 2}
    intake = [i for i in data_stack.runtime.invocations if "Intake" in i.function]
    assert all(not i.failed for i in intake), "retries happen inside the call, not by SQS"
    assert set(status_by_key(data_stack).values()) == {"curated"}
    assert_every_upload_accounted_for_once(data_stack)


# ------------------------------------------------------------------------------------ writes --
# Room for botocore's backoff within one invocation: a call refused at every attempt waits up to
# ~91 s (up to 1, 2, 4, 8, 16, then 20 s between attempts), so that its message fails, not the whole
# invocation by a timeout. The visibility timeout cannot be shorter than the function's.
PATIENT_INTAKE = {"FunctionTimeoutSeconds": "95", "IntakeVisibilityTimeoutSeconds": "95"}
SEEDS = (1, 2, 3)  # scene-3 lands in the validation split: the drop can start a run


def attempts() -> int:
    """How many attempts the functions' clients make in all (botocore's `max_attempts` counts retries)."""
    total: int = clients.make("s3").meta.config.retries["total_max_attempts"]
    return total


def hold_runs(stack: OfflineStack) -> None:
    """Runs wait an hour: the trigger freezes a real manifest, and nothing trains meanwhile."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec("retrain-local-TriggerFunction")
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))


def audit(stack: OfflineStack) -> dict[str, Any]:
    """`retrain data audit --grace-seconds 0 --json`, as an engineer runs it after the drop."""
    env = {"DATA_BUCKET": stack.ref("DataBucket"), "LEDGER_TABLE": stack.ref("LedgerTable")}
    result = CliRunner().invoke(app, ["data", "audit", "--json", "--grace-seconds", "0"], env=env)
    assert result.exit_code in {0, 1}, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def versions_of(stack: OfflineStack, key: str) -> list[str]:
    listed = stack.aws.s3.list_object_versions(Bucket=stack.ref("DataBucket"), Prefix=key)
    return [v["VersionId"] for v in listed.get("Versions", []) if v["Key"] == key]


def curated_keys(batch: str, stems: list[str]) -> list[str]:
    return [
        f"dataset/{kind}/{batch}/{stem}.{ext}" for stem in stems for kind, ext in (("images", "jpg"), ("labels", "png"))
    ]


@pytest.mark.parametrize("data_stack", [PATIENT_INTAKE], indirect=True)
def test_a_drop_whose_every_first_write_is_throttled_is_curated_once_and_audits_clean(
    data_stack: OfflineStack,
) -> None:
    hold_runs(data_stack)
    stems = [f"scene-{seed}" for seed in SEEDS]
    for stem, seed in zip(stems, SEEDS, strict=True):
        upload_pair(data_stack, "rush-hour", stem, scene(seed))
    upload(data_stack, "incoming/rush-hour/_COMPLETE", b"")
    # Every item's and every object's first write is refused, as a hot partition refuses it.
    operations = ("dynamodb.PutItem", "dynamodb.UpdateItem", "s3.CopyObject", "s3.DeleteObject")
    with WriteThrottler(*(Throttle(operation, times=1) for operation in operations)) as throttler:
        drain(data_stack)
        wait_until(lambda: len(executions(data_stack)) == 1, timeout=60, message="a run on the drop")

    assert set(throttler.throttled) == set(operations), throttler.throttled
    intake = [i for i in data_stack.runtime.invocations if "Intake" in i.function]
    assert intake and not any(i.failed for i in intake), "botocore's retries absorb a single throttle"
    assert all(not i.payload.get("batchItemFailures") for i in intake), [i.payload for i in intake]
    assert queue_depth(data_stack, "IntakeQueue") == 0
    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert set(status_by_key(data_stack).values()) == {"curated", "marker"}
    for key in curated_keys("rush-hour", stems):
        assert throttler.refusals("s3.CopyObject", key) == 1, f"the copy to {key} was not throttled"
        # A throttled copy that had been written after all would leave a second version here.
        assert len(versions_of(data_stack, key)) == 1, f"{key} curated more than once"
    landing = {key for key, _ in landing_versions(data_stack)}
    assert landing == {"incoming/rush-hour/_COMPLETE"}, "every landing copy is deleted once curated"
    assert_every_upload_accounted_for_once(data_stack)
    report = audit(data_stack)
    assert (report["clean"], report["discrepancies"]) == (True, []), report["discrepancies"]
    assert report["checked"]["manifest_lines"] == len(stems), report["checked"]


@pytest.fixture(params=["mock", "server"])
def either_stack(request: pytest.FixtureRequest) -> Iterator[OfflineStack]:
    """The stack in-process (mock_aws) or behind its loopback server: moto's backends either way."""
    options = StackOptions(mode=request.param, parameters=DATA, poll=False, tick=False, upload_trainer=False)
    with OfflineStack(options) as offline:
        yield offline


def test_a_throttled_put_writes_nothing_and_the_next_attempt_writes_it_once(either_stack: OfflineStack) -> None:
    # Retries off: the client sees the one attempt's answer, and the test what it left behind.
    no_retries = Config(retries={"mode": "standard", "total_max_attempts": 1})
    s3 = clients.make("s3", config=no_retries, endpoint_url=either_stack.endpoint_url)
    dynamodb = clients.make("dynamodb", config=no_retries, endpoint_url=either_stack.endpoint_url)
    bucket, table = either_stack.ref("DataBucket"), either_stack.ref("LedgerTable")
    key = "incoming/late-shift/images/crossing.jpg"
    item = {"pk": {"S": "batch#late-shift"}, "sk": {"S": "note"}}
    throttles = (
        Throttle("s3.PutObject", times=1, keys=lambda k: k == key),
        Throttle("dynamodb.PutItem", times=1, keys=lambda k: k == "batch#late-shift note", code="ThrottlingException"),
    )
    waiting = queue_depth(either_stack, "IntakeQueue")  # S3's test event, from when notifications were set up

    with WriteThrottler(*throttles) as throttler:
        with pytest.raises(ClientError) as put:
            s3.put_object(Bucket=bucket, Key=key, Body=scene(5).image)
        with pytest.raises(ClientError) as put_item:
            dynamodb.put_item(TableName=table, Item=item)

        answer = put.value.response
        assert (answer["Error"]["Code"], answer["ResponseMetadata"]["HTTPStatusCode"]) == ("SlowDown", 503)
        assert put_item.value.response["Error"]["Code"] == "ThrottlingException"
        assert versions_of(either_stack, key) == [], "a throttled PutObject left a version behind"
        assert queue_depth(either_stack, "IntakeQueue") == waiting, "a throttled PutObject notified the intake"
        assert "Item" not in dynamodb.get_item(TableName=table, Key=item, ConsistentRead=True)

        written = s3.put_object(Bucket=bucket, Key=key, Body=scene(5).image)["VersionId"]
        dynamodb.put_item(TableName=table, Item=item)

    assert versions_of(either_stack, key) == [written]
    assert "Item" in dynamodb.get_item(TableName=table, Key=item, ConsistentRead=True)
    assert throttler.refused == [("s3.PutObject", key), ("dynamodb.PutItem", "batch#late-shift note")]


# It waits out a 95-second visibility timeout: 100 s on 2 cores, so `make test-quick` leaves it out.
@pytest.mark.slow(seconds=100)
@pytest.mark.parametrize("data_stack", [PATIENT_INTAKE], indirect=True)
def test_a_copy_throttled_beyond_botocores_retries_is_retried_by_sqs_and_nothing_is_lost(
    data_stack: OfflineStack,
) -> None:
    image, every_attempt = "dataset/images/night/scene-4.jpg", attempts()
    beyond = Throttle("s3.CopyObject", times=every_attempt + 1, keys=lambda k: k == image)
    upload_pair(data_stack, "night", "scene-4", scene(4))

    with WriteThrottler(beyond) as throttler:
        drain(data_stack)
        # Every attempt of the first delivery was refused: botocore gave up, the message failed.
        assert throttler.refusals("s3.CopyObject", image) == every_attempt
        assert versions_of(data_stack, image) == []
        assert len(landing_versions(data_stack)) == 2, "the uploads wait in the landing zone"
        assert queue_depth(data_stack, "IntakeQueue") == 1, "the failed message waits for redelivery"
        # SQS delivers it again once its visibility timeout has passed.
        wait_until(lambda: drain(data_stack) > 0, timeout=150, message="the message delivered again")

    assert throttler.refusals("s3.CopyObject", image) == every_attempt + 1
    assert queue_depth(data_stack, "IntakeQueue") == 0
    assert queue_depth(data_stack, "IntakeDeadLetterQueue") == 0
    assert set(status_by_key(data_stack).values()) == {"curated"}
    for key in curated_keys("night", ["scene-4"]):
        assert len(versions_of(data_stack, key)) == 1, f"{key} curated more than once"
    assert_every_upload_accounted_for_once(data_stack)
    report = audit(data_stack)
    assert (report["clean"], report["discrepancies"]) == (True, []), report["discrepancies"]
