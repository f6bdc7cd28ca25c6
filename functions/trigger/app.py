"""Trigger: start a retraining when enough new data is ready.

Invoked on a schedule, after batches close, after a run's lock was released, and by a person's
`retrain runs start` (`TriggerInput`). It frees no lock: ReleaseFunction does
(`functions/release/logic.py`).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import TriggerInput
from functions.common.settings import TriggerSettings, load_settings

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = TriggerInput.parse(event)
    outcome = wiring.trigger(load_settings(TriggerSettings)).handle(request)
    if outcome.started:
        metrics.add_metric(name="RetrainingsStarted", unit="Count", value=1)
    logger.info("trigger ran", extra={"source": request.source, **outcome.model_dump()})
    return outcome.model_dump()
