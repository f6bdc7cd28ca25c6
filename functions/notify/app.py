"""Notify: the run's outcome by e-mail (SNS, attributes to filter on) and in Slack."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parameters import SecretsProvider
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import NotifySettings, load_settings
from functions.notify.logic import Notifier, NotifyRequest

logger, tracer, metrics = observability.for_function()
SECRET_MAX_AGE_SECONDS = 300  # a rotated webhook is picked up within five minutes
# One per cold start, with the project's client (its retries, the offline endpoint).
secrets = SecretsProvider(boto3_client=clients.secretsmanager())


def webhook_url(secret_arn: str) -> str | None:
    if not secret_arn:
        return None
    secret: Any = secrets.get(secret_arn, transform="json", max_age=SECRET_MAX_AGE_SECONDS)
    return str(secret.get("webhook_url") or "") or None


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(NotifySettings)
    notifier = Notifier(
        s3=clients.s3(),
        sns=clients.sns(),
        sts=clients.sts(),
        bucket=settings.data_bucket,
        topic_arn=settings.notification_topic_arn,
        region=settings.aws_region,
        report_reader_role_arn=settings.report_reader_role_arn,
        webhook=lambda: webhook_url(settings.slack_webhook_secret_arn),
    )
    with clients.busy_is_retryable():
        notified = notifier.notify(NotifyRequest.model_validate(event))
    logger.info("team notified", extra=notified.model_dump())
    return notified.model_dump()
