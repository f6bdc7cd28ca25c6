"""Start the run's job, wait for its end (its events, the safety poll), stop it on failure: one
function around the job."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

from functions import wiring
from functions.common import observability
from functions.common.models import JobState
from functions.common.requests import AwaitTraining, JobStateChange, SweepWaits, parse_training_request
from functions.common.settings import TrainingJobSettings, load_settings
from functions.training_job.waiting import WaitReport

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(TrainingJobSettings)
    request = parse_training_request(event)
    if isinstance(request, AwaitTraining | SweepWaits | JobStateChange):
        result: BaseModel = wiring.job_waits(settings).handle(request)
    else:
        result = wiring.training_jobs(settings).handle(request)
    _count_jobs_that_outlived_their_run(result)
    logger.info("training job %s", request.action, extra=result.model_dump(mode="json"))
    return result.model_dump(mode="json")


def _count_jobs_that_outlived_their_run(result: BaseModel) -> None:
    """The state "Start training" found its run ended (stopped or timed out while it ran) and
    stopped the job; the safety poll stopped jobs nothing else had (OrphanJobsAlarm tells the team)."""
    if isinstance(result, JobState) and result.run_ended is not None:
        metrics.add_metric(name="RunEndedDuringStartTraining", unit="Count", value=1)
    if isinstance(result, WaitReport) and result.orphans:
        stopped = sum(orphan.stopped for orphan in result.orphans)
        metrics.add_metric(name="OrphanJobsStopped", unit="Count", value=stopped)
