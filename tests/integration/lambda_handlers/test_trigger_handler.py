"""The trigger handler, from its callers (schedule, kick), and ReleaseFunction's, from the state
machine's last states: the trigger looks and frees no lock; the release frees the named run's lock
and has the trigger look."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.common.errors import InvalidEventError
from functions.data.ledger import Ledger
from functions.data.models import LockRecord
from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.data_drops import wait_until


@pytest.mark.parametrize("event", ["schedule.json", "trigger_kick.json"])
def test_with_no_data_nothing_starts_and_the_reason_is_given(deployed: OfflineStack, handler: Any, event: str) -> None:
    outcome = handler("TriggerFunction")(load_event(event))

    assert outcome == {"started": None, "reason": "no new curated pairs in closed batches"}


def hold(deployed: OfflineStack, run: str) -> Ledger:
    ledger = Ledger(deployed.aws.dynamodb, deployed.ref("LedgerTable"))
    now = datetime.now(UTC)
    lock = LockRecord(holder=run, acquired_at=now, expires_at=now + timedelta(days=7))
    assert ledger.acquire_lock(lock, replacing=None)
    return ledger


def test_a_release_sent_to_the_trigger_is_refused_and_the_running_runs_lock_stays(
    deployed: OfflineStack, handler: Any
) -> None:
    """The intake and the sweeper may invoke the trigger: whatever they send, it frees no lock."""
    release = load_event("release.json")
    ledger = hold(deployed, release["holder"])

    with pytest.raises(InvalidEventError, match=r"the trigger frees no lock: .* ReleaseFunction"):
        handler("TriggerFunction")({**release, "action": "release"})

    lock = ledger.lock()
    assert lock is not None and lock.holder == release["holder"]


def test_the_release_frees_the_named_runs_lock_and_has_the_trigger_look(deployed: OfflineStack, handler: Any) -> None:
    release = load_event("release.json")
    ledger = hold(deployed, release["holder"])
    trigger = deployed.ref("TriggerFunction")

    outcome = handler("ReleaseFunction")(release)

    assert outcome == {"holder": release["holder"], "released": True}
    assert ledger.lock() is None
    assert ledger.run_end(release["holder"]) is None, "the finished run's last state told the team already"
    wait_until(
        lambda: any(i.function == trigger and not i.failed for i in deployed.runtime.invocations),
        timeout=30,
        message="the trigger's look after the release",
    )


def test_the_release_frees_no_other_runs_lock_and_refuses_a_request_without_its_holder(
    deployed: OfflineStack, handler: Any
) -> None:
    ledger = hold(deployed, "ds-20261203-120000-0badc0de")
    release = handler("ReleaseFunction")

    assert release(load_event("release.json"))["released"] is False
    with pytest.raises(InvalidEventError, match="holder"):
        release({"source": "someone"})
    lock = ledger.lock()
    assert lock is not None and lock.holder == "ds-20261203-120000-0badc0de"


def test_a_release_that_owes_the_message_records_the_runs_end_with_it(deployed: OfflineStack, handler: Any) -> None:
    release = {**load_event("release.json"), "source": "the state machine's failure branch", "owes_message": True}
    ledger = hold(deployed, release["holder"])

    assert handler("ReleaseFunction")(release)["released"] is True
    assert handler("ReleaseFunction")(release)["released"] is False

    end = ledger.run_end(release["holder"])
    assert end is not None and (end.freed_by, end.message) == ("the state machine's failure branch", "owed")
