"""The sweeper handler, on its schedule: quiet batches closed, lone files given up on."""

from __future__ import annotations

from typing import Any

from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.data_drops import scene


def test_a_quiet_batch_with_a_lone_image_is_closed_and_the_image_quarantined(
    deployed: OfflineStack, handler: Any
) -> None:
    s3, bucket = deployed.aws.s3, deployed.ref("DataBucket")
    s3.put_object(Bucket=bucket, Key="incoming/handler-test/images/street 1.jpg", Body=scene(3).image)
    only_the_image = load_event("sqs_s3_notifications.json")
    only_the_image["Records"] = only_the_image["Records"][:1]
    handler("IntakeFunction")(only_the_image)

    sweep = handler("SweeperFunction", QUIET_PERIOD_SECONDS="0", INCOMPLETE_AFTER_SECONDS="0")
    result = sweep(load_event("schedule.json"))

    assert result == {"closed": ["handler-test"], "incomplete": 1, "reported": ["handler-test"]}
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="quarantine/")
    assert [o["Key"] for o in listed["Contents"]] == [
        "quarantine/handler-test/images/street 1.jpg",
        "quarantine/handler-test/images/street 1.jpg.reason.json",
    ]


def test_a_sweep_with_nothing_to_do_says_so(deployed: OfflineStack, handler: Any) -> None:
    result = handler("SweeperFunction")(load_event("schedule.json"))

    assert result == {"closed": [], "incomplete": 0, "reported": []}
