"""SyncToFsx: start an FSx import of the curated zone, and look at it until it has ended."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import wiring
from functions.common import observability
from functions.common.requests import SyncRequest
from functions.common.settings import DatasetSyncSettings, load_settings

logger, tracer, metrics = observability.for_function()
NO_IMPORT = "No FSx import: the training job reads the dataset from S3"


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@wiring.busy_is_retryable()
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(DatasetSyncSettings)
    request = SyncRequest.model_validate(event)
    sync = wiring.dataset_sync(settings).sync(request)
    logger.info(
        "FSx import" if sync.task_id else NO_IMPORT,
        extra={"bucket": settings.data_bucket, **sync.model_dump(mode="json")},
    )
    return sync.model_dump(mode="json")
