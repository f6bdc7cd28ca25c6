"""Notify, called by the failure branch and after an evaluation, with the SNS message it sent."""

from __future__ import annotations

import json
from typing import Any

from retrain.local.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.helpers import TopicInbox


def test_a_failed_run_is_told_with_its_cause_and_leaves_a_summary(deployed: OfflineStack, handler: Any) -> None:
    inbox = TopicInbox(deployed, deployed.ref("NotificationTopic"))

    notified = handler("NotifyFunction")(
        {"kind": "failed", "execution": "ds-20261203-091500-4f1c2a9b", "state": load_event("run_failed_state.json")}
    )

    (message,) = inbox.messages()
    assert (
        message["Subject"]
        == notified["subject"]
        == ("Retraining failed at Check the FSx import - ds-20261203-091500-4f1c2a9b")
    )
    assert "ended FAILED: Access denied" in message["Message"]
    assert '"errorType"' not in message["Message"], "the cause in words, not the Lambda's JSON"
    assert message["MessageAttributes"]["outcome"]["Value"] == "failed"
    key = "reports/runs/ds-20261203-091500-4f1c2a9b/summary.json"
    summary = json.loads(deployed.aws.s3.get_object(Bucket=deployed.ref("DataBucket"), Key=key)["Body"].read())
    assert (summary["outcome"], summary["error"], summary["failed_state"]) == (
        "failed",
        "FsxImportFailedError",
        "Check the FSx import",
    )
