"""Sweeper (scheduled): close quiet batches, give up on pairs whose partner never came."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import observability
from functions.common.settings import SweeperSettings, load_settings
from functions.data.wiring import kick_trigger, ledger_and_bucket, report_closed
from functions.intake.logic import Intake
from functions.validation import DEFAULT_CONFIG

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(SweeperSettings)
    ledger, bucket = ledger_and_bucket(settings)
    intake = Intake(ledger=ledger, bucket=bucket, config=DEFAULT_CONFIG)
    now = datetime.now(UTC)
    quiet = ledger.open_batches_quiet_since(now - timedelta(seconds=settings.quiet_period_seconds))
    for batch in quiet:
        intake.close(batch.batch, "quiet period")
    stale = ledger.pending_pairs_seen_before(
        now - timedelta(seconds=settings.incomplete_after_seconds)
    )
    for pair in stale:
        intake.expire(pair)
    reported = report_closed(intake.touched | intake.newly_closed, ledger, bucket)
    metrics.add_metric(name="BatchesClosedQuiet", unit="Count", value=len(quiet))
    metrics.add_metric(name="PairsIncomplete", unit="Count", value=len(stale))
    if intake.newly_closed:
        kick_trigger(settings.trigger_function, "quiet batches closed")
    summary = {
        "closed": sorted(intake.newly_closed),
        "incomplete": len(stale),
        "reported": reported,
    }
    logger.info("swept", extra=summary)
    return summary
