"""Sweeper (scheduled): close quiet batches, give up on pairs whose partner never came.

Its schedule's event carries nothing the sweep needs: there is no request to parse.
"""

from __future__ import annotations

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
    result = wiring.sweeper(settings).sweep()
    metrics.add_metric(name="BatchesClosedQuiet", unit="Count", value=len(result.closed))
    metrics.add_metric(name="PairsIncomplete", unit="Count", value=result.incomplete)
    logger.info("swept", extra=result.model_dump())
    return result.model_dump()
