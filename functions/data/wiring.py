"""Building the data layer from a function's settings: one place, so handlers stay short."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from functions.common import clients
from functions.common.settings import LedgerSettings
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus
from functions.data.reports import write_report
from functions.data.storage import DataBucket


def ledger_and_bucket(settings: LedgerSettings) -> tuple[Ledger, DataBucket]:
    return Ledger(clients.dynamodb(), settings.ledger_table), DataBucket(
        clients.s3(), settings.data_bucket
    )


def report_closed(batches: set[str], ledger: Ledger, bucket: DataBucket) -> list[str]:
    """Rewrite the report of every closed batch among `batches`; the batches reported."""
    reported = []
    for batch in sorted(batches):
        found = ledger.batch(batch)
        if found is not None and found[0].status is BatchStatus.CLOSED:
            write_report(batch, ledger, bucket)
            reported.append(batch)
    return reported


def kick_trigger(function_name: str, reason: str) -> None:
    """Run the trigger soon, without waiting for it (it decides whether anything starts)."""
    if not function_name:
        return
    clients.lambda_().invoke(
        FunctionName=function_name,
        InvocationType="Event",
        Payload=json.dumps({"source": reason, "time": datetime.now(UTC).isoformat()}).encode(),
    )
