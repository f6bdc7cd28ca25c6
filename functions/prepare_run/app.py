"""First state of a run: is the dataset version there, and how big is it?"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import PrepareRunSettings, load_settings
from functions.prepare_run.logic import parse_run_input, prepare_run

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(PrepareRunSettings)
    with clients.busy_is_retryable():
        run = prepare_run(parse_run_input(event), s3=clients.s3(), settings=settings)
    logger.info("run prepared", extra=run.model_dump(mode="json"))
    return run.model_dump(mode="json")
