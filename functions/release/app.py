"""ReleaseFunction: free a run's lock when the run has ended, then have the trigger look for new data.

Invoked by the state machine's last states and by RunEndedFunction (`ReleaseInput`); the trigger
itself frees no lock (`functions/release/logic.py` says why).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import ReleaseInput
from functions.common.settings import ReleaseSettings, load_settings

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ReleaseInput.parse(event)
    outcome = wiring.release(load_settings(ReleaseSettings)).handle(request)
    logger.info("release ran", extra={"source": request.source, **outcome.model_dump()})
    return outcome.model_dump()
