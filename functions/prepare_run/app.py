"""First state of a run: is the dataset version there, and how big is it?"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import RunInput
from functions.common.settings import PrepareRunSettings, load_settings

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(PrepareRunSettings)
    request = RunInput.parse(event)
    run = wiring.run_preparer(settings).prepare(request)
    logger.info("run prepared", extra=run.model_dump(mode="json"))
    return run.model_dump(mode="json")
