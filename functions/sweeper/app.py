"""Sweeper (scheduled): close quiet batches, give up on pairs whose partner never came."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.settings import SweeperSettings, load_settings

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(SweeperSettings)
    result = wiring.intake(settings).sweep(
        datetime.now(UTC),
        quiet_for=timedelta(seconds=settings.quiet_period_seconds),
        incomplete_after=timedelta(seconds=settings.incomplete_after_seconds),
    )
    metrics.add_metric(name="BatchesClosedQuiet", unit="Count", value=len(result.closed))
    metrics.add_metric(name="PairsIncomplete", unit="Count", value=result.incomplete)
    if result.closed:
        wiring.kick_trigger(settings.trigger_function, "quiet batches closed")
    logger.info("swept", extra=result.model_dump())
    return result.model_dump()
