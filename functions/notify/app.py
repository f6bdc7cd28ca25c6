"""Notify: the run's outcome by e-mail (SNS, attributes to filter on) and in Slack."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import NotifyRequest
from functions.common.settings import NotifySettings, load_settings

logger, tracer, metrics = observability.for_function()
# One per cold start: it keeps the Slack webhook it read for five minutes.
secrets = wiring.secrets_provider()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(NotifySettings)
    request = NotifyRequest.model_validate(event)
    # A claim on a run end's message lasts as long as this invocation may still be sending it.
    notified = wiring.notifier(settings, secrets, context.get_remaining_time_in_millis).notify(request)
    logger.info("team notified", extra=notified.model_dump())
    return notified.model_dump()
