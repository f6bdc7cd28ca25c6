"""Notify, called by the failure branch and after an evaluation, with the SNS message it sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from retrain.local.cloudformation.stack import OfflineStack
from retrain.local.events.notifications import Misbehaviour
from tests.conftest import load_event


def test_a_failed_run_is_told_with_its_cause_and_leaves_a_summary(deployed: OfflineStack, handler: Any) -> None:
    inbox = deployed.topic_inbox()

    notified = handler("NotifyFunction")(
        {"kind": "failed", "execution": "ds-20261203-091500-4f1c2a9b", "state": load_event("run_failed_state.json")}
    )

    (message,) = inbox.receive()
    assert (
        message["Subject"]
        == notified["subject"]
        == ("Retraining failed at Check the FSx import - ds-20261203-091500-4f1c2a9b")
    )
    assert "ended FAILED: Access denied" in message["Message"]
    assert '"errorType"' not in message["Message"], "the cause in words, not the Lambda's JSON"
    assert message["MessageAttributes"]["outcome"]["Value"] == "failed"
    assert notified["slack"] == {"delivered": True, "skipped": None, "status": 200, "attempts": 1, "error": None}
    key = "reports/failures/ds-20261203-091500-4f1c2a9b/summary.json"
    summary = json.loads(deployed.aws.s3.get_object(Bucket=deployed.ref("DataBucket"), Key=key)["Body"].read())
    assert (summary["outcome"], summary["error"], summary["failed_state"]) == (
        "failed",
        "FsxImportFailedError",
        "Check the FSx import",
    )


def test_the_optional_started_message_says_what_the_run_trains_on(deployed: OfflineStack, handler: Any) -> None:
    inbox = deployed.topic_inbox()

    notified = handler("NotifyFunction")(
        {"kind": "started", "execution": "ds-20261203-091500-4f1c2a9b", "run": load_event("run_context.json")}
    )

    assert notified["outcome"] == "running" and notified["summary_uri"] is None
    (message,) = inbox.receive()
    assert message["Subject"] == "Retraining started - ds-20261203-091500-4f1c2a9b"
    assert "3 pairs" in message["Message"]
    assert notified["slack"]["delivered"] is True
    assert deployed.slack is not None
    assert deployed.slack.messages[0]["text"] == message["Subject"]


@pytest.mark.parametrize(
    "slack_down",
    [
        pytest.param([Misbehaviour(500)] * 5, id="500 every time"),
        pytest.param([Misbehaviour(429, "rate_limited", retry_after=600)], id="429 for ten minutes"),
        pytest.param(None, id="connection refused"),
    ],
)
def test_slack_down_never_stops_the_email_nor_fails_the_function(
    deployed: OfflineStack, handler: Any, slack_down: list[Misbehaviour] | None, capfd: pytest.CaptureFixture[str]
) -> None:
    assert deployed.slack is not None
    url = deployed.slack.url
    if slack_down is None:
        deployed.slack.stop()
    else:
        deployed.slack.misbehave(*slack_down)
    inbox = deployed.topic_inbox()

    notified = handler("NotifyFunction")(
        {"kind": "failed", "execution": "ds-20261203-091500-4f1c2a9b", "state": load_event("run_failed_state.json")}
    )

    assert [m["Subject"][:17] for m in inbox.receive()] == ["Retraining failed"]
    assert notified["slack"]["delivered"] is False and notified["slack"]["error"]
    captured = capfd.readouterr()
    assert url not in captured.out + captured.err + json.dumps(notified)


@pytest.mark.parametrize(
    ("stored", "delivered"),
    [
        pytest.param("{url}", True, id="the plain URL, as Slack hands it out"),
        pytest.param('{{"webhook_url": "{url}"}}', True, id="as JSON"),
        pytest.param("the channel's webhook", False, id="neither"),
    ],
)
def test_an_operators_webhook_is_read_in_either_form_and_any_other_is_named(
    deployed: OfflineStack, handler: Any, stored: str, delivered: bool
) -> None:
    assert deployed.slack is not None
    secret = deployed.ref("SlackWebhookSecret")
    deployed.aws.secretsmanager.put_secret_value(SecretId=secret, SecretString=stored.format(url=deployed.slack.url))

    notified = handler("NotifyFunction")(
        {"kind": "failed", "execution": "ds-20261203-091500-4f1c2a9b", "state": load_event("run_failed_state.json")}
    )

    assert notified["slack"]["delivered"] is delivered
    assert len(deployed.slack.messages) == (1 if delivered else 0)
    if not delivered:
        assert notified["slack"]["skipped"].startswith("the Slack secret must hold the incoming-webhook URL")
