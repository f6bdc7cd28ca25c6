"""Slack delivery: an incoming webhook, retried a bounded number of times, never fatal.

slack-sdk's `WebhookClient` posts the message; its retry handlers, tuned here, retry connection
errors and timeouts, 429 (honouring Retry-After up to a cap, so a Lambda never sleeps for an
hour), any 5xx, and once any other 4xx. Whatever happens, the outcome is returned, not raised: a
Slack outage must not fail the run or stop the SNS message. The webhook URL is a secret (anyone
holding it can post to the channel): it never appears in a log line, an error or the outcome.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.webhook import WebhookClient

TIMEOUT_SECONDS = 5
RETRIES = 2
MAX_RETRY_AFTER_SECONDS = 10
# slack-sdk logs the URL (at DEBUG, and in some of its retry messages): its logger here emits
# nothing; the outcome, with the URL taken out, is what gets logged.
_QUIET = logging.getLogger("retrain.slack-sdk")
_QUIET.setLevel(logging.CRITICAL + 1)
_QUIET.propagate = False


class SlackOutcome(BaseModel):
    delivered: bool
    skipped: str | None = None  # why nothing was sent (no webhook configured)
    status: int | None = None
    attempts: int = 0
    error: str | None = None  # what went wrong, with the webhook URL taken out


class _ServerErrors(RetryHandler):
    """Every 5xx (slack-sdk's own handler knows only 500 and 503)."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and response.status_code >= 500


class _ClientErrors(RetryHandler):
    """A 4xx other than 429, once: a webhook being rotated may answer 404 for a moment."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and 400 <= response.status_code < 500 and response.status_code != 429


class _RateLimited(RateLimitErrorRetryHandler):
    """429: wait what Retry-After asks, but never more than `MAX_RETRY_AFTER_SECONDS`."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        return _retry_after(response) <= MAX_RETRY_AFTER_SECONDS

    def prepare_for_next_attempt(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        assert response is not None
        state.next_attempt_requested = True
        time.sleep(_retry_after(response))
        state.increment_current_attempt()


def _retry_after(response: HttpResponse) -> float:
    for name, values in response.headers.items():
        if name.lower() == "retry-after" and values:
            try:
                return float(values[0])
            except ValueError:
                return 1.0
    return 1.0


def retry_handlers() -> list[RetryHandler]:
    connection = ConnectionErrorRetryHandler(max_retry_count=RETRIES)
    connection.error_types_to_do_retries = [*connection.error_types_to_do_retries, TimeoutError]
    return [
        connection,
        _RateLimited(max_retry_count=RETRIES),
        _ServerErrors(max_retry_count=RETRIES),
        _ClientErrors(max_retry_count=1),
    ]


def post(url: str, message: dict[str, Any], *, timeout_seconds: float = TIMEOUT_SECONDS) -> SlackOutcome:
    """Send `message` (`text` and `blocks`) to the webhook; the outcome, never an exception."""
    failures = {"count": 0}
    client = WebhookClient(url, timeout=timeout_seconds, retry_handlers=retry_handlers(), logger=_QUIET)  # type: ignore[arg-type]
    client.retry_handlers.insert(0, _Counter(failures))
    try:
        response = client.send_dict(message)
    except Exception as error:
        return SlackOutcome(
            delivered=False, attempts=failures["count"], error=_without(url, f"{type(error).__name__}: {error}")
        )
    delivered = response.status_code == 200
    return SlackOutcome(
        delivered=delivered,
        status=response.status_code,
        attempts=failures["count"] + (1 if delivered else 0),
        error=None if delivered else _without(url, f"HTTP {response.status_code}: {str(response.body)[:200]}"),
    )


class _Counter(RetryHandler):
    """Counts the failed attempts (slack-sdk asks its handlers after each one); never retries."""

    def __init__(self, failures: dict[str, int]) -> None:
        super().__init__(max_retry_count=0)
        self._failures = failures

    def can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        self._failures["count"] += 1
        return False


def _without(url: str, text: str) -> str:
    return text.replace(url, "<webhook>") if url else text
