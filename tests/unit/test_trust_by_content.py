"""Trust belongs to a pair's content, never to its batch (issue 34): when the trigger freezes a
dataset version, a pair whose label was replaced in a trusted batch is `new` (so the next run
screens it) while its unchanged siblings stay `trusted`; a held pair is in no version, and a pair
added to its batch afterwards is, as new. The trigger on moto's S3 and DynamoDB; Step Functions is
a stand-in that records the runs started."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from functions.common.contracts import ManifestEntry, parse_manifest, split_for
from functions.common.prefixes import manifest_key
from functions.common.taxonomy import Taxonomy
from functions.data.ledger import Ledger
from functions.data.models import Trust
from functions.data.storage import DataBucket
from functions.trigger.logic import Trigger, TriggerPolicy
from retrain.local.cloudformation.stack import create_ledger_table
from tests.unit.trust_stories import curate, freeze, relabel, screened, sha256

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(days=7)
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:retrain-retrain"
# A run starts for any new pair; the validation split is half of the pairs, so a few stems give both.
POLICY = TriggerPolicy(min_new_pairs=1, max_delay_seconds=0, settle_seconds=0, val_fraction=0.5)
STEMS = [f"scene-{index}" for index in range(6)]


@dataclass
class RecordingSfn:
    """Step Functions as far as the trigger uses it: runs start, and none of them is running."""

    started: list[str] = field(default_factory=list)

    def start_execution(self, **request: Any) -> dict[str, Any]:
        self.started.append(request["name"])
        return {"executionArn": f"{MACHINE}:{request['name']}"}

    def describe_execution(self, **request: Any) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "ExecutionDoesNotExist", "Message": "no"}}, "DescribeExecution")


@pytest.fixture
def trigger() -> Iterator[Trigger]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        yield Trigger(
            Ledger(dynamodb, "ledger"),
            DataBucket(s3, "data"),
            RecordingSfn(),  # type: ignore[arg-type]
            MACHINE,
            Taxonomy(),
            POLICY,
            clock=lambda: NOW,
        )


def frozen(trigger: Trigger) -> dict[str, ManifestEntry]:
    """The version the trigger starts a run on now, by image: what that run trains and screens."""
    outcome = trigger.run()
    assert outcome.started is not None, f"no run started: {outcome.reason}"
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket="data", Key=manifest_key(outcome.started))
    text = body["Body"].read().decode()
    # The run ends at once: the next look may start another.
    assert trigger.ledger.release_lock(outcome.started)
    return {entry.image: entry for entry in parse_manifest(text)}


def trusted_drop(trigger: Trigger, batch: str) -> dict[str, str]:
    """A drop an earlier run froze and screened, every pair passed by an independent judgement."""
    contents = curate(trigger.ledger, batch, STEMS, at=EARLIER)
    splits = {split_for(sha256(f"{batch}/{stem}"), POLICY.val_fraction) for stem in STEMS}
    assert splits == {"train", "val"}, "the story needs both splits in one drop"
    freeze(trigger.ledger, batch, "ds-earlier")
    screened(trigger.ledger, batch, dict.fromkeys(contents.values(), Trust.TRUSTED), run="ds-earlier", at=EARLIER)
    return contents


def test_a_label_replaced_in_a_trusted_batch_is_frozen_new_while_its_siblings_stay_trusted(trigger: Trigger) -> None:
    trusted_drop(trigger, "munich-01")

    fixed = relabel(
        trigger.ledger, "munich-01", "scene-2", "munich-01/scene-2: road redrawn", at=NOW - timedelta(hours=1)
    )
    version = frozen(trigger)

    trusts = {image: entry.trust for image, entry in version.items()}
    assert trusts.pop("images/munich-01/scene-2.jpg") == "new", "the replaced pair must be screened again"
    assert set(trusts.values()) == {"trusted"}, f"an unchanged sibling lost its trust: {trusts}"
    assert version["images/munich-01/scene-2.jpg"].digest == fixed, "the version pins the new label"
    assert {entry.team for entry in version.values()} == {"munich"}


def test_a_held_pair_is_left_out_and_a_pair_added_to_its_batch_later_is_in_as_new(trigger: Trigger) -> None:
    contents = trusted_drop(trigger, "munich-01")
    screened(trigger.ledger, "munich-01", {contents["scene-4"]: Trust.HELD}, run="ds-later", at=NOW - timedelta(days=1))

    added = curate(trigger.ledger, "munich-01", ["scene-9"], at=NOW - timedelta(hours=1))
    version = frozen(trigger)

    assert "images/munich-01/scene-4.jpg" not in version, "a held pair is in a dataset version"
    assert version["images/munich-01/scene-9.jpg"].trust == "new", "trust was inherited from the batch"
    assert version["images/munich-01/scene-9.jpg"].digest == added["scene-9"]
    assert {image: entry.trust for image, entry in version.items() if "scene-9" not in image} == {
        f"images/munich-01/{stem}.jpg": "trusted" for stem in STEMS if stem != "scene-4"
    }


def test_a_held_pair_alone_starts_no_run(trigger: Trigger) -> None:
    contents = curate(trigger.ledger, "berlin-02", ["street-0"], at=EARLIER)
    screened(trigger.ledger, "berlin-02", {contents["street-0"]: Trust.HELD}, run="ds-earlier", at=EARLIER)

    outcome = trigger.run()

    assert outcome.started is None and "no new curated pairs" in outcome.reason, outcome


def test_a_start_asked_for_while_a_batch_settles_says_to_ask_again(trigger: Trigger) -> None:
    settling = replace(trigger, policy=replace(POLICY, settle_seconds=60, min_new_pairs=500))
    curate(settling.ledger, "munich-01", STEMS, at=NOW - timedelta(seconds=10))

    asked = settling.run(requested_by="ana")
    later = replace(settling, clock=lambda: NOW + timedelta(seconds=50)).run(requested_by="ana")

    assert asked.started is None, asked
    assert asked.reason == (
        "no new curated pairs in closed batches; 1 closed batch(es) still settling (an object arrived less "
        "than 60 s ago): ask again after that"
    )
    assert later.started is not None and later.reason == "6 new pairs, started on request by ana", later
