"""Notify: the run's outcome to the team's SNS topic (e-mail subscribers filter on attributes)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import NotifySettings, load_settings
from functions.notify.logic import Notifier, NotifyRequest

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(NotifySettings)
    notifier = Notifier(clients.s3(), clients.sns(), settings.data_bucket, settings.notification_topic_arn)
    with clients.busy_is_retryable():
        notified = notifier.notify(NotifyRequest.model_validate(event))
    logger.info("team notified", extra=notified.model_dump())
    return notified.model_dump()
