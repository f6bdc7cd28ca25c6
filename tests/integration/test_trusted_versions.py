"""Dataset versions carry each pair's trust, and a held pair is in none (issues 26 and 34).

A team's first drop is new when its run freezes a version; once an independent screening passed
its pairs, the next version names them trusted. Pairs a screening held are left out of every later
version, and a person's release (named, with a reason) lets them back in, as `released`. Trust
follows each pair's content: the verdicts are on the pairs as they were judged. Runs wait an hour
in a stand-in machine; the test plays each run's screening (the verdicts its evaluation records).
"""

from __future__ import annotations

from datetime import UTC, datetime

from functions.common.contracts import parse_manifest
from functions.common.prefixes import manifest_key
from functions.data.ledger import Ledger
from functions.data.models import BatchTrust, Trust, TrustDecision
from functions.data.reports import curated_contents
from retrain.local.cloudformation.stack import OfflineStack
from retrain.ops.trust import release_batch
from tests.integration.runs import release_and_look
from tests.integration.test_trigger_growth import (
    FIRST_DROP,
    drop,
    hold_runs_in_a_waiting_machine,
    ledger_of,
    trigger,
    wait_until_consumed,
)

NOW = datetime(2026, 12, 5, tzinfo=UTC)
OPERATOR = "arn:aws:sts::123456789012:assumed-role/retrain-TrustOperatorRole-1A2B/alice"


def trusts_in_newest_version(stack: OfflineStack) -> dict[str, set[str]]:
    """Each batch of the version the running run froze, with the trusts its pairs were frozen
    with; the run then ends (its lock released), and nothing else starts."""
    ledger = ledger_of(stack)
    lock = ledger.lock()
    assert lock is not None, "a run holds the lock"
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=manifest_key(lock.holder))["Body"].read()
    found: dict[str, set[str]] = {}
    for entry in parse_manifest(body.decode()):
        found.setdefault(entry.batch, set()).add(entry.trust)
    assert release_and_look(stack, lock.holder)["started"] is None
    return found


def screening_judges(ledger: Ledger, batch: str, verdict: Trust, run: str) -> None:
    """What a run's evaluation records when its screening passed (independently) or held every
    curated pair of `batch`: a verdict per pair content."""
    contents = curated_contents(ledger.pairs(batch)).values()
    decision = TrustDecision(verdict=str(verdict), by=f"run {run}'s screening", run=run, at=NOW, pairs=len(contents))

    def record(current: BatchTrust) -> BatchTrust:
        return current.model_copy(
            update={
                "pairs": {**current.pairs, **dict.fromkeys(contents, verdict)},
                "decisions": [*current.decisions, decision],
            }
        )

    ledger.update_trust(batch, record)


def test_versions_name_each_pairs_trust_and_leave_held_pairs_out(data_stack: OfflineStack) -> None:
    hold_runs_in_a_waiting_machine(data_stack)
    ledger = ledger_of(data_stack)

    drop(data_stack, "week-1", FIRST_DROP)
    wait_until_consumed(data_stack, "week-1")
    assert trusts_in_newest_version(data_stack) == {"week-1": {"new"}}
    screening_judges(ledger, "week-1", Trust.TRUSTED, "run-1")

    drop(data_stack, "week-2", (12, 13))
    wait_until_consumed(data_stack, "week-2")
    assert trusts_in_newest_version(data_stack) == {"week-1": {"trusted"}, "week-2": {"new"}}
    # That run's screening finds week-2's labels wrong: its pairs are held.
    screening_judges(ledger, "week-2", Trust.HELD, "run-2")
    assert trigger(data_stack)["started"] is None, "held pairs are no new data"

    drop(data_stack, "week-3", (14,))
    wait_until_consumed(data_stack, "week-3")
    assert trusts_in_newest_version(data_stack) == {"week-1": {"trusted"}, "week-3": {"new"}}

    released = release_batch(ledger, "week-2", reason="checked by hand: the labels are right", by=OPERATOR)
    assert released.offered == 2
    assert trigger(data_stack)["started"] is not None, "the released pairs are new data"
    assert trusts_in_newest_version(data_stack) == {
        "week-1": {"trusted"},
        "week-2": {"released"},
        "week-3": {"new"},
    }
