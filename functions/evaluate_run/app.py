"""EvaluateRun: publish the run's reports, apply the quality gate, record an accepted model."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import EvaluateRequest
from functions.common.settings import EvaluateRunSettings, load_settings

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(EvaluateRunSettings)
    request = EvaluateRequest.model_validate(event)
    evaluation = wiring.evaluator(settings).evaluate(request.run, request.job)
    metrics.add_metric(name=f"Runs{evaluation.outcome.capitalize()}", unit="Count", value=1)
    logger.info("run evaluated", extra=evaluation.model_dump())
    return evaluation.model_dump()
