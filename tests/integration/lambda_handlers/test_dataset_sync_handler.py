"""SyncToFsx, called as the state machine calls it: start the import, then look until it ended."""

from __future__ import annotations

from typing import Any

from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event


def test_the_curated_zone_is_imported_and_the_second_look_says_done(deployed: OfflineStack, handler: Any) -> None:
    deployed.aws.s3.put_object(Bucket=deployed.ref("DataBucket"), Key="dataset/images/b/x.jpg", Body=b"jpeg")
    sync = handler("DatasetSyncFunction")
    run = load_event("run_context.json")

    started = sync({"action": "start", "run": run})
    assert deployed.fsx is not None
    deployed.fsx.wait(started["task_id"])
    looked = sync({"action": "check", "run": run, "sync": started})

    assert started["file_system_id"] == deployed.ref("DatasetFileSystem")
    assert (looked["lifecycle"], looked["done"], looked["files"], looked["checks"]) == ("SUCCEEDED", True, 1, 1)
    assert looked["wait_seconds"] == 0, "the run's poll_seconds of 0 stays 0"
