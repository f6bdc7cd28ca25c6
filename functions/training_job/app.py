"""StartTraining, WaitForJob and the failure branch's stop: one function around the job."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.errors import InvalidEventError
from functions.common.settings import TrainingJobSettings, load_settings
from functions.training_job import run

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(TrainingJobSettings)
    request = run.TrainingRequest.model_validate(event)
    aws: dict[str, Any] = {"sagemaker": clients.sagemaker()}
    store = {"s3": clients.s3(), "bucket": settings.data_bucket}
    with clients.busy_is_retryable():
        if request.action == "start" and request.run is not None:
            result: Any = run.start(run.job_config(settings), request.run, **aws, **store)
        elif request.action == "check" and request.job is not None and request.run is not None:
            result = run.check(request.job, run=request.run, **aws)
        elif request.action == "stop" and request.state is not None:
            result = run.stop_if_started(run.job_config(settings), request.state, **aws, **store)
        else:
            raise InvalidEventError(f"{request.action} lacks what it needs: {sorted(event)}")
    logger.info("training job %s", request.action, extra=result.model_dump(mode="json"))
    return dict(result.model_dump(mode="json"))
