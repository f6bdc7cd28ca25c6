"""SyncToFsx: start an FSx import of the curated zone, and look at it until it has ended."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import DatasetSyncSettings, load_settings
from functions.dataset_sync.logic import SyncRequest, check_import, nothing_to_import, start_import

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(DatasetSyncSettings)
    request = SyncRequest.model_validate(event)
    if settings.file_system_id is None:
        sync = nothing_to_import(request.run)
        logger.info("No FSx import: the training job reads the dataset from S3", extra={"bucket": settings.data_bucket})
        return sync.model_dump(mode="json")
    with clients.busy_is_retryable():
        if request.action == "start" or request.sync is None:
            sync = start_import(
                clients.fsx(),
                file_system_id=settings.file_system_id,
                bucket=settings.data_bucket,
                run=request.run,
            )
        else:
            sync = check_import(
                clients.fsx(),
                request.sync,
                run=request.run,
                timeout_seconds=settings.import_timeout_seconds,
            )
    logger.info("FSx import", extra=sync.model_dump(mode="json"))
    return sync.model_dump(mode="json")
