"""The Slack webhook secret: what it may hold, and reading it.

An operator stores the channel's incoming-webhook URL either as Slack hands it out, a plain
`https://hooks.slack.com/services/...`, or as `{"webhook_url": "https://hooks.slack.com/..."}`
(the form the stack creates, with an empty URL until one is stored). Anything else is a
`SlackSecretError` whose message says what the secret must hold, without quoting what it holds:
the URL is a credential.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from functions.common.errors import RetrainError

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

SECRET_MAX_AGE_SECONDS = 300  # a rotated webhook is picked up within five minutes
WHAT_IT_MUST_HOLD = (
    "the Slack secret must hold the incoming-webhook URL, either as Slack gives it "
    '("https://hooks.slack.com/services/...") or as {"webhook_url": "https://hooks.slack.com/services/..."}'
)


class SlackSecretError(RetrainError, ValueError):
    """The Slack secret holds neither a webhook URL nor `{"webhook_url": URL}`."""


def webhook_url(secret: str | bytes | None) -> str | None:
    """The webhook URL the secret's value holds; None while none is stored (empty)."""
    text = (secret.decode("utf-8", "replace") if isinstance(secret, bytes) else secret or "").strip()
    if not text:
        return None
    if text.startswith(("https://", "http://")):
        return text  # usable or not (https, or http on loopback) is `usable_webhook`'s to say
    try:
        document: Any = json.loads(text)
    except ValueError:
        raise SlackSecretError(f"{WHAT_IT_MUST_HOLD}; it holds text that is neither") from None
    if not isinstance(document, dict):
        raise SlackSecretError(f"{WHAT_IT_MUST_HOLD}; it holds JSON that is not an object")
    url = document.get("webhook_url")
    if url is None or not isinstance(url, str):
        raise SlackSecretError(f"{WHAT_IT_MUST_HOLD}; it holds a JSON object without a webhook_url string")
    return url.strip() or None


@dataclass(frozen=True)
class SlackWebhookSecret:
    """Reads the webhook URL from the secret when a message is sent (cached for five minutes by
    `provider`, which lives as long as the function's cold start)."""

    provider: SecretsProvider
    secret_arn: str  # empty: no Slack

    def __call__(self) -> str | None:
        if not self.secret_arn:
            return None
        value: Any = self.provider.get(self.secret_arn, max_age=SECRET_MAX_AGE_SECONDS)
        return webhook_url(value)
