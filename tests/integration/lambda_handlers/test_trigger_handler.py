"""The trigger handler, from each of its three callers: schedule, kick, and the state machine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.common.errors import InvalidEventError
from functions.data.ledger import Ledger
from functions.data.models import LockRecord
from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event


@pytest.mark.parametrize("event", ["schedule.json", "trigger_kick.json"])
def test_with_no_data_nothing_starts_and_the_reason_is_given(deployed: OfflineStack, handler: Any, event: str) -> None:
    outcome = handler("TriggerFunction")(load_event(event))

    assert outcome == {
        "started": None,
        "reason": "no new curated pairs in closed batches",
        "released": None,
    }


def test_a_release_from_the_state_machine_frees_the_lock_and_looks_again(deployed: OfflineStack, handler: Any) -> None:
    release = load_event("trigger_release.json")
    ledger = Ledger(deployed.aws.dynamodb, deployed.ref("LedgerTable"))
    now = datetime.now(UTC)
    lock = LockRecord(holder=release["holder"], acquired_at=now, expires_at=now + timedelta(days=7))
    assert ledger.acquire_lock(lock, replacing=None)

    outcome = handler("TriggerFunction")(release)

    assert outcome["released"] is True
    assert outcome["started"] is None
    assert ledger.lock() is None


def test_a_release_that_names_no_holder_is_refused(deployed: OfflineStack, handler: Any) -> None:
    with pytest.raises(InvalidEventError, match="must name the holder"):
        handler("TriggerFunction")({"action": "release"})
