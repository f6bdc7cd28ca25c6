"""The notifier, as the Notify function builds it: the team's e-mail and Slack message about a
failed run, whatever form the operator stored the Slack webhook in.

No AWS: the Slack secret is read through a stubbed Secrets Manager client, the summary is written
to an in-memory bucket and the e-mail to an in-memory topic; Slack is a real HTTP server on
loopback (`SlackReceiver`, the offline stack's).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from aws_lambda_powertools.utilities.parameters import SecretsProvider

from functions import wiring
from functions.common.requests import NotifyRequest
from functions.common.settings import NotifySettings
from functions.notify import slack as slack_delivery
from functions.notify.logic import Notified, Notifier
from functions.notify.secret import SlackSecretError, SlackWebhookSecret, webhook_url
from retrain.local.events.notifications import SlackReceiver
from tests.conftest import load_event
from tests.unit.fakes import FakeS3, FakeSNS, stubbed

BUCKET = "retrain-data-123456789012-us-east-1"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:SlackWebhookSecret-AbCdEf"
SETTINGS = NotifySettings(
    aws_region="us-east-1",
    powertools_service_name="notify",
    data_bucket=BUCKET,
    notification_topic_arn="arn:aws:sns:us-east-1:123456789012:retrain-notifications",
    ledger_table="retrain-LedgerTable",
    slack_webhook_secret_arn=SECRET_ARN,
    report_reader_role_arn="arn:aws:iam::123456789012:role/retrain-report-reader",
)
FAILED = NotifyRequest(
    kind="failed", execution="ds-20261203-091500-4f1c2a9b", state=load_event("run_failed_state.json")
)


@pytest.fixture
def slack() -> Iterator[SlackReceiver]:
    receiver = SlackReceiver().start()
    yield receiver
    receiver.stop()


def _notify_with_secret(secret: str | None, settings: NotifySettings = SETTINGS) -> tuple[Notified, FakeSNS]:
    """Build the notifier as the function does, with the secret holding `secret` (None: the
    secret is never read), and tell the team about a failed run."""
    with stubbed("secretsmanager") as (secretsmanager, stub):
        if secret is not None:
            answer = {"ARN": SECRET_ARN, "Name": "SlackWebhookSecret", "SecretString": secret}
            stub.add_response("get_secret_value", answer, {"SecretId": SECRET_ARN})
        notifier = wiring.notifier(settings, SecretsProvider(boto3_client=secretsmanager))
        sns = FakeSNS()
        # No run-end record to send through (tests/unit/test_run_cleanup.py sends through one).
        notified = dataclasses.replace(notifier, s3=FakeS3(), sns=sns, once=None).notify(FAILED)
    return notified, sns


def test_the_notifier_is_built_from_the_functions_settings() -> None:
    provider = SecretsProvider()

    notifier = wiring.notifier(SETTINGS, provider)

    assert isinstance(notifier, Notifier)
    assert (notifier.bucket, notifier.topic_arn, notifier.region) == (
        BUCKET,
        SETTINGS.notification_topic_arn,
        "us-east-1",
    )
    assert notifier.report_reader_role_arn == SETTINGS.report_reader_role_arn
    assert notifier.webhook == SlackWebhookSecret(provider, SECRET_ARN), "the secret is read when a message is sent"
    assert notifier.once is not None, "a run end's message is sent through its record, once"


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param("{url}", id="the plain URL, as Slack hands it out"),
        pytest.param("{url}\n", id="the plain URL with a newline"),
        pytest.param('{{"webhook_url": "{url}"}}', id="as JSON"),
    ],
)
def test_an_operators_webhook_reaches_the_channel_in_either_form(slack: SlackReceiver, stored: str) -> None:
    notified, sns = _notify_with_secret(stored.format(url=slack.url))

    assert (notified.slack.delivered, notified.slack.status) == (True, 200)
    (message,) = slack.messages
    assert message["text"] == notified.subject == sns.published[0]["Subject"]
    assert notified.subject.startswith("Retraining failed at Check the FSx import")


@pytest.mark.parametrize(
    ("stored", "holds"),
    [
        pytest.param("hooks.slack.com/services/T0/B0/0ff1ine5ecret", "text that is neither", id="no scheme"),
        pytest.param(
            '{"url": "https://hooks.slack.com/services/T0/B0/0ff1ine5ecret"}', "without a webhook_url", id="another key"
        ),
        pytest.param('["https://hooks.slack.com/services/T0/B0/0ff1ine5ecret"]', "not an object", id="a list"),
    ],
)
def test_a_secret_in_another_form_skips_slack_saying_what_it_must_hold(stored: str, holds: str) -> None:
    notified, sns = _notify_with_secret(stored)

    assert not notified.slack.delivered
    assert notified.slack.skipped is not None
    assert notified.slack.skipped.startswith("the Slack secret must hold the incoming-webhook URL, either as Slack")
    assert '{"webhook_url": "https://hooks.slack.com/services/..."}' in notified.slack.skipped
    assert holds in notified.slack.skipped
    assert "0ff1ine5ecret" not in notified.model_dump_json(), "what the secret holds is never repeated"
    assert len(sns.published) == 1, "the e-mail still goes out"


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("https://collector.example/services/T0/B0/0ff1ine5ecret", id="another host"),
        pytest.param("https://hooks.slack.com.collector.example/services/T0/B0/0ff1ine5ecret", id="a lookalike"),
        pytest.param("https://hooks.slack.com@collector.example/services/T0/B0/0ff1ine5ecret", id="userinfo"),
        pytest.param("https://hooks.slack.com:8443/services/T0/B0/0ff1ine5ecret", id="another port"),
        pytest.param("http://collector.example/services/T0/B0/0ff1ine5ecret", id="plain http"),
    ],
)
def test_a_webhook_anywhere_but_slacks_host_is_never_posted_to(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whoever can change the secret must not get the run's results and report links sent elsewhere.
    def post(*_: object, **__: object) -> None:
        raise AssertionError("the message was posted")

    monkeypatch.setattr(slack_delivery, "post", post)

    notified, sns = _notify_with_secret(json.dumps({"webhook_url": url}))

    assert not notified.slack.delivered
    assert notified.slack.skipped is not None
    assert "hooks.slack.com" in notified.slack.skipped or "not an https URL" in notified.slack.skipped
    assert "collector" not in notified.model_dump_json(), "the URL is never repeated"
    assert len(sns.published) == 1, "the e-mail still goes out"


def test_until_a_webhook_is_stored_slack_is_skipped() -> None:
    notified, sns = _notify_with_secret('{"webhook_url": "", "unused": "x"}')

    assert notified.slack.skipped == "no Slack webhook is configured (the secret holds no URL yet)"
    assert len(sns.published) == 1


def test_without_a_secret_the_secret_is_never_read() -> None:
    notified, _ = _notify_with_secret(None, SETTINGS.model_copy(update={"slack_webhook_secret_arn": ""}))

    assert notified.slack.skipped is not None and "no Slack webhook is configured" in notified.slack.skipped


@pytest.mark.parametrize(
    ("secret", "url"),
    [
        ("https://hooks.slack.com/services/T0/B0/x", "https://hooks.slack.com/services/T0/B0/x"),
        (b"https://hooks.slack.com/services/T0/B0/x", "https://hooks.slack.com/services/T0/B0/x"),
        (
            '  {"webhook_url": " https://hooks.slack.com/services/T0/B0/x "}\n',
            "https://hooks.slack.com/services/T0/B0/x",
        ),
        ("", None),
        (None, None),
        ('{"webhook_url": ""}', None),
    ],
)
def test_what_a_secret_holds_is_read_as_its_webhook_url(secret: str | bytes | None, url: str | None) -> None:
    assert webhook_url(secret) == url


def test_a_secret_that_holds_neither_form_is_refused_by_name() -> None:
    with pytest.raises(SlackSecretError, match="must hold the incoming-webhook URL"):
        webhook_url(json.dumps({"webhook_url": 42}))
