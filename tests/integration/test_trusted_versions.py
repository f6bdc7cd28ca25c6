"""Dataset versions carry each batch's trust, and a held batch is in none (issue 26).

A team's first drop is new when its run freezes a version; once an accepted run trained on it,
the next version names it trusted. A held batch (an operator's hold here; a run's screening
holds the same way) is left out of every later version, its new pairs start nothing, and a
release lets it back in, as `released`. Runs wait an hour in a stand-in machine.
"""

from __future__ import annotations

from datetime import UTC, datetime

from functions.common.contracts import parse_manifest
from functions.common.prefixes import manifest_key
from functions.data.models import Trust, TrustRecord
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.test_trigger_growth import (
    FIRST_DROP,
    drop,
    hold_runs_in_a_waiting_machine,
    ledger_of,
    trigger,
    wait_until_consumed,
)

NOW = datetime(2026, 12, 5, tzinfo=UTC)


def trusts_in_newest_version(stack: OfflineStack) -> dict[str, str]:
    ledger = ledger_of(stack)
    lock = ledger.lock()
    assert lock is not None, "a run holds the lock"
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=manifest_key(lock.holder))["Body"].read()
    found = {entry.batch: entry.trust for entry in parse_manifest(body.decode())}
    assert trigger(stack, action="release", holder=lock.holder)["started"] is None
    return found


def test_versions_name_each_batchs_trust_and_leave_held_batches_out(data_stack: OfflineStack) -> None:
    hold_runs_in_a_waiting_machine(data_stack)
    ledger = ledger_of(data_stack)

    drop(data_stack, "week-1", FIRST_DROP)
    wait_until_consumed(data_stack, "week-1")
    assert trusts_in_newest_version(data_stack) == {"week-1": "new"}

    # An accepted run trained on week-1; week-2's labels are held before its drop is trained on.
    ledger.trust_batches([TrustRecord(batch="week-1", trust=Trust.TRUSTED, by="the gate", at=NOW)])
    ledger.set_trust(TrustRecord(batch="week-2", trust=Trust.HELD, reasons=["by hand"], by="operator", at=NOW))
    drop(data_stack, "week-2", (12, 13))
    assert trigger(data_stack)["started"] is None, "a held batch's pairs start nothing"

    drop(data_stack, "week-3", (14,))
    wait_until_consumed(data_stack, "week-3")
    assert trusts_in_newest_version(data_stack) == {"week-1": "trusted", "week-3": "new"}

    ledger.set_trust(TrustRecord(batch="week-2", trust=Trust.RELEASED, by="operator", at=NOW))
    assert trigger(data_stack)["started"] is not None, "the released batch's pairs are new data"
    assert trusts_in_newest_version(data_stack) == {"week-1": "trusted", "week-2": "released", "week-3": "new"}
