"""RunEnded: after a run stopped from the console or timed out, stop its job, tell the team and
free the lock (the failure branch's work, for the ends that skip it)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.settings import RunEndedSettings, load_settings
from functions.run_ended.logic import ExecutionStatusChange

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(RunEndedSettings)
    change = ExecutionStatusChange.model_validate(EventBridgeModel.model_validate(event).detail)
    outcome = wiring.run_ended(settings).handle(change)
    metrics.add_metric(name=f"RunsEnded{change.status.title().replace('_', '')}", unit="Count", value=1)
    logger.info("run ended", extra=outcome.model_dump())
    return outcome.model_dump()
