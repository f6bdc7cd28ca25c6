"""Trigger: start a retraining when enough new data is ready; release the lock after a run.

Invoked after batches close, on a schedule, and by the state machine's last state with
`{"action": "release", "holder": <execution name>}` (then it looks again, so data that came
during the run starts the next one).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.common import clients, observability
from functions.common.settings import TriggerSettings, load_settings
from functions.data.trigger import Trigger, TriggerPolicy
from functions.data.wiring import ledger_and_bucket
from functions.validation import DEFAULT_CONFIG

logger, tracer, metrics = observability.for_function()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = load_settings(TriggerSettings)
    ledger, bucket = ledger_and_bucket(settings)
    trigger = Trigger(
        ledger=ledger,
        bucket=bucket,
        sfn=clients.stepfunctions(),
        state_machine_arn=settings.state_machine_arn,
        taxonomy=DEFAULT_CONFIG.taxonomy,
        policy=TriggerPolicy(
            min_new_pairs=settings.min_new_pairs,
            max_delay_seconds=settings.max_delay_seconds,
            settle_seconds=settings.settle_seconds,
            lock_ttl_seconds=settings.lock_ttl_seconds,
            val_fraction=settings.val_fraction,
        ),
        clock=lambda: datetime.now(UTC),
    )
    released = None
    if event.get("action") == "release":
        released = trigger.release(str(event["holder"]))
    outcome = trigger.run()
    if outcome.started:
        metrics.add_metric(name="RetrainingsStarted", unit="Count", value=1)
    logger.info("trigger ran", extra={"started": outcome.started, "reason": outcome.reason})
    return {"started": outcome.started, "reason": outcome.reason, "released": released}
