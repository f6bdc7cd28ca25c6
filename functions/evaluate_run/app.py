"""EvaluateRun: publish the run's reports, apply the quality gate, record an accepted model."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict

from functions.common import clients, observability
from functions.common.models import JobState, RunContext
from functions.common.settings import EvaluateRunSettings, load_settings
from functions.evaluate_run.gate import GatePolicy
from functions.evaluate_run.logic import Evaluator

logger, tracer, metrics = observability.for_function()


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run: RunContext
    job: JobState


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(EvaluateRunSettings)
    request = EvaluateRequest.model_validate(event)
    policy = GatePolicy(miou_tolerance=settings.gate_miou_tolerance, class_tolerance=settings.gate_class_tolerance)
    evaluator = Evaluator(
        clients.s3(),
        clients.sagemaker(),
        settings.data_bucket,
        policy,
        settings.model_package_group,
    )
    with clients.busy_is_retryable():
        evaluation = evaluator.evaluate(request.run, request.job)
    metrics.add_metric(name=f"Runs{evaluation.outcome.capitalize()}", unit="Count", value=1)
    logger.info("run evaluated", extra=evaluation.model_dump())
    return evaluation.model_dump()
