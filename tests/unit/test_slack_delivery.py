"""Slack down, slow or rate limiting: the message is retried a bounded number of times, the
outcome says what happened, nothing is raised, and the webhook URL never shows."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

from functions.notify import slack
from functions.notify.logic import usable_webhook
from retrain.local.events.notifications import Misbehaviour, SlackReceiver

MESSAGE = {"text": "Retraining accepted", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]}


@pytest.fixture
def receiver() -> Iterator[SlackReceiver]:
    started = SlackReceiver().start()
    yield started
    started.stop()


@pytest.fixture(autouse=True)
def _every_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


def _no_url(url: str, outcome: slack.SlackOutcome, caplog: pytest.LogCaptureFixture) -> None:
    assert url not in outcome.model_dump_json()
    assert url not in caplog.text
    assert "0ff1ine5ecret" not in caplog.text


def test_a_message_reaches_the_channel(receiver: SlackReceiver, caplog: pytest.LogCaptureFixture) -> None:
    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.status, outcome.attempts) == (True, 200, 1)
    assert receiver.messages == [MESSAGE]
    _no_url(receiver.url, outcome, caplog)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_server_error_is_retried_and_the_message_delivered(
    receiver: SlackReceiver, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    receiver.misbehave(Misbehaviour(status))

    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.attempts) == (True, 2)
    _no_url(receiver.url, outcome, caplog)


def test_a_rate_limit_is_waited_out_as_slack_asks(receiver: SlackReceiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.misbehave(Misbehaviour(429, "rate_limited", retry_after=1))

    started = time.monotonic()
    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.attempts) == (True, 2)
    assert time.monotonic() - started >= 1, "Retry-After was honoured"
    _no_url(receiver.url, outcome, caplog)


def test_a_rate_limit_longer_than_a_lambda_should_sleep_gives_up(receiver: SlackReceiver) -> None:
    receiver.misbehave(Misbehaviour(429, "rate_limited", retry_after=3600))

    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.status, outcome.attempts) == (False, 429, 1)
    assert receiver.messages == []


def test_an_outage_is_retried_a_bounded_number_of_times_then_reported(
    receiver: SlackReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.misbehave(*[Misbehaviour(500)] * 10)

    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.status) == (False, 500)
    assert outcome.attempts == slack.RETRIES + 1
    assert receiver.requests == slack.RETRIES + 1
    _no_url(receiver.url, outcome, caplog)


def test_a_bad_request_is_tried_once_more_only(receiver: SlackReceiver) -> None:
    receiver.misbehave(*[Misbehaviour(404, "no_service")] * 5)

    outcome = slack.post(receiver.url, MESSAGE)

    assert (outcome.delivered, outcome.status, receiver.requests) == (False, 404, 2)


def test_a_slow_slack_times_out_and_is_retried(receiver: SlackReceiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.misbehave(Misbehaviour(200, "ok", delay_seconds=2.0))

    outcome = slack.post(receiver.url, MESSAGE, timeout_seconds=0.5)

    assert outcome.delivered, outcome
    assert outcome.attempts == 2
    _no_url(receiver.url, outcome, caplog)


def test_slack_refusing_connections_is_reported_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/services/T0/B0/0ff1ine5ecret"

    outcome = slack.post(url, MESSAGE, timeout_seconds=0.5)

    assert not outcome.delivered
    assert outcome.attempts == slack.RETRIES + 1
    assert outcome.error is not None and "URLError" in outcome.error
    _no_url(url, outcome, caplog)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "no Slack webhook is configured"),
        (None, "no Slack webhook is configured"),
        ("hooks.slack.com/services/x", "not an https URL"),
        ("http://hooks.slack.com/services/x", "not an https URL"),
        ("https://127.0.0.1:8080/services/x", "not on Slack's webhook host hooks.slack.com"),
        ("https://example.com/services/x", "not on Slack's webhook host hooks.slack.com"),
        ("https://hooks.slack.com.example.com/services/x", "not on Slack's webhook host hooks.slack.com"),
        ("https://user:pw@hooks.slack.com/services/x", "not on Slack's webhook host hooks.slack.com"),
        ("https://hooks.slack.com:8443/services/x", "not on Slack's webhook host hooks.slack.com"),
        ("https://hooks.slack.com:port/services/x", "not on Slack's webhook host hooks.slack.com"),
    ],
)
def test_an_empty_placeholder_or_foreign_webhook_is_a_reason_to_skip_slack(url: str | None, says: str) -> None:
    assert says in str(usable_webhook(url))


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com/services/T0/B0/x",
        "https://HOOKS.slack.com:443/services/T0/B0/x",
        "http://127.0.0.1:8080/services/T0/B0/x",
        "http://localhost:8080/services/T0/B0/x",
        "http://[::1]:8080/services/T0/B0/x",
    ],
)
def test_slacks_webhook_host_and_the_offline_loopback_one_are_usable(url: str) -> None:
    assert usable_webhook(url) is None
