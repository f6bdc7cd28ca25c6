"""One lock, one run: the one `RunLock` and its rule (`functions/data/run_lock.py`), how a run's
first state makes sure its own execution holds it (`RunLockGuard`), freeing by name that only one
caller wins, and a lease that outlives every run the state machine lets run. On moto's DynamoDB
with the template's ledger table; Step Functions is a fake that answers DescribeExecution with the
statuses each story needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from functions.common.errors import InvalidRunInputError, LockHeldByAnotherRunError
from functions.common.requests import RunInput
from functions.common.settings import LOCK_TTL_SECONDS, PrepareRunSettings, TriggerSettings
from functions.data.ledger import Ledger
from functions.data.models import LockRecord
from functions.data.run_lock import STARTING_RUN_SECONDS, Executions, RunLock
from functions.prepare_run.logic import RunLockGuard, RunPreparer
from functions.trigger.logic import TriggerPolicy
from tests.unit.fakes import body, stubbed

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:retrain-retrain"
RUNNING_RUN = "ds-20270201-090000-0badc0de"  # started by the trigger a month ago, still training
MANUAL = "an-operators-manual-start"


@dataclass
class FakeSfn:
    """DescribeExecution of the executions a story names; any other does not exist."""

    statuses: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def describe_execution(self, **request: Any) -> dict[str, Any]:
        arn = request["executionArn"]
        self.asked.append(arn)
        name = arn.rsplit(":", 1)[1]
        assert arn == f"{MACHINE.replace(':stateMachine:', ':execution:')}:{name}", arn
        if name not in self.statuses:
            raise ClientError({"Error": {"Code": "ExecutionDoesNotExist", "Message": arn}}, "DescribeExecution")
        return {"executionArn": arn, "status": self.statuses[name]}


def lease(holder: str, *, expired: bool) -> LockRecord:
    acquired = NOW - timedelta(days=40)
    return LockRecord(
        holder=holder, acquired_at=acquired, expires_at=NOW - timedelta(days=1) if expired else NOW + timedelta(days=1)
    )


def run_lock(ledger: Ledger, sfn: FakeSfn | None) -> RunLock:
    executions = Executions(sfn, MACHINE) if sfn is not None else None  # type: ignore[arg-type]
    return RunLock(ledger, lambda: NOW, executions)


def keeps_out(record: LockRecord, sfn: FakeSfn | None) -> bool:
    """The rule alone: the ledger is never read."""
    return run_lock(None, sfn).keeps_out(record)  # type: ignore[arg-type]


def guard(ledger: Ledger, sfn: FakeSfn) -> RunLockGuard:
    return RunLockGuard(run_lock(ledger, sfn), ttl_seconds=LOCK_TTL_SECONDS)


# ------------------------------------------------------------------ the rule --
@pytest.mark.parametrize("expired", [False, True], ids=["lease valid", "lease expired"])
def test_a_run_whose_execution_is_running_holds_the_lock_whatever_its_lease_says(expired: bool) -> None:
    sfn = FakeSfn({RUNNING_RUN: "RUNNING"})

    assert keeps_out(lease(RUNNING_RUN, expired=expired), sfn)
    assert sfn.asked, "Step Functions was asked, not the clock"


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "ABORTED", "TIMED_OUT", None])
def test_a_run_that_ended_or_never_started_holds_nothing(status: str | None) -> None:
    sfn = FakeSfn({RUNNING_RUN: status} if status else {})

    assert not keeps_out(lease(RUNNING_RUN, expired=False), sfn)


@pytest.mark.parametrize(("age", "held"), [(60, True), (STARTING_RUN_SECONDS - 1, True), (STARTING_RUN_SECONDS, False)])
def test_a_run_whose_execution_is_not_started_yet_holds_the_lock_while_its_trigger_may_still_start_it(
    age: int, held: bool
) -> None:
    """The trigger takes the lock a moment before it starts the execution named after it: a second
    trigger (or a purge) looking in between must not take it over. After Lambda's longest timeout
    no trigger is still on its way, and the lock is free."""
    taken = LockRecord(
        holder=RUNNING_RUN, acquired_at=NOW - timedelta(seconds=age), expires_at=NOW + timedelta(days=31)
    )

    assert keeps_out(taken, FakeSfn()) is held


def test_a_purge_keeps_its_own_rule_its_lease() -> None:
    sfn = FakeSfn()
    purge = "purge:20270301-085959-ab12"

    assert keeps_out(lease(purge, expired=False), sfn)
    assert not keeps_out(lease(purge, expired=True), sfn)
    assert sfn.asked == [], "a purge has no execution to ask about"


@pytest.mark.parametrize("expired", [False, True], ids=["lease valid", "lease expired"])
def test_without_the_state_machine_to_ask_the_lease_is_the_rule_for_runs_too(expired: bool) -> None:
    assert keeps_out(lease(RUNNING_RUN, expired=expired), None) is not expired


def test_a_lock_is_freed_by_name_once_whoever_asks_again(ledger: Ledger) -> None:
    """The clean-up's rule rests on this: of a failure branch, RunEndedFunction, a duplicated
    event and a cancel, exactly one frees the run's lock (and so tells the team)."""
    lock = run_lock(ledger, FakeSfn())
    taken = lock.take(RUNNING_RUN, 60, over=None, dataset_version="ds-20270101-000000-00000000")
    assert taken is not None and lock.holds(RUNNING_RUN)
    assert ledger.lock() == taken, "the run's dataset version is recorded beside its name"

    assert not lock.release("another-run"), "only by its holder's name"
    assert [lock.release(RUNNING_RUN), lock.release(RUNNING_RUN)] == [True, False]
    assert ledger.lock() is None and not lock.holds(RUNNING_RUN)


def test_a_release_owing_the_message_records_the_runs_end_with_it_once(ledger: Ledger) -> None:
    """The lock's delete and the end's record succeed or fail together (one DynamoDB transaction):
    the one caller that frees the lock records the run's end, its message owed."""
    lock = run_lock(ledger, FakeSfn())
    assert lock.take(RUNNING_RUN, 60, over=None) is not None

    assert not lock.release("another-run", ended_by="RunEndedFunction"), "only by its holder's name"
    assert ledger.run_end("another-run") is None, "nothing recorded for a lock not freed"
    freed = [lock.release(RUNNING_RUN, ended_by=who) for who in ("the failure branch", "RunEndedFunction")]

    assert freed == [True, False]
    end = ledger.run_end(RUNNING_RUN)
    assert end is not None and (end.freed_by, end.freed_at, end.message) == ("the failure branch", NOW, "owed")
    assert ledger.lock() is None


# ----------------------------------------------------- a run's first state --
def test_a_run_the_trigger_started_holds_the_lock_already(ledger: Ledger) -> None:
    ledger.acquire_lock(lease(RUNNING_RUN, expired=False), replacing=None)
    sfn = FakeSfn({RUNNING_RUN: "RUNNING"})

    guard(ledger, sfn).hold(RUNNING_RUN)

    assert ledger.lock() == lease(RUNNING_RUN, expired=False), "unchanged"
    assert sfn.asked == [], "its own lock: nobody to ask about"


def test_a_manual_start_while_another_run_trains_is_refused_and_the_lock_stays_with_it(ledger: Ledger) -> None:
    held = lease(RUNNING_RUN, expired=True)  # even past its lease: its execution is RUNNING
    ledger.acquire_lock(held, replacing=None)

    with pytest.raises(LockHeldByAnotherRunError) as refused:
        guard(ledger, FakeSfn({RUNNING_RUN: "RUNNING"})).hold(MANUAL)

    assert str(refused.value) == (
        f"run {RUNNING_RUN} holds the retraining lock: this execution ({MANUAL}) would train beside it; "
        f"start it again when {RUNNING_RUN} has ended, or use `retrain runs rerun`"
    )
    assert ledger.lock() == held


def test_a_manual_start_during_a_purge_is_refused(ledger: Ledger) -> None:
    purge = lease("purge:20270301-085959-ab12", expired=False)
    ledger.acquire_lock(purge, replacing=None)

    with pytest.raises(LockHeldByAnotherRunError, match=r"a purge \(purge:20270301-085959-ab12\) holds"):
        guard(ledger, FakeSfn()).hold(MANUAL)
    assert ledger.lock() == purge


@pytest.mark.parametrize("before", ["free", "SUCCEEDED", "ABORTED", "never started"])
def test_a_manual_start_takes_a_free_lock_for_its_own_execution(ledger: Ledger, before: str) -> None:
    statuses = {RUNNING_RUN: before} if before in {"SUCCEEDED", "ABORTED"} else {}
    if before != "free":
        ledger.acquire_lock(lease(RUNNING_RUN, expired=False), replacing=None)

    guard(ledger, FakeSfn(statuses)).hold(MANUAL)

    lock = ledger.lock()
    assert lock is not None and lock.holder == MANUAL
    assert lock.expires_at == NOW + timedelta(seconds=LOCK_TTL_SECONDS)


def test_of_two_manual_starts_at_once_the_one_that_writes_second_is_refused(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sfn = FakeSfn({MANUAL: "RUNNING", "the-other-start": "RUNNING"})
    guard(ledger, sfn).hold(MANUAL)
    # The other start looked just before the first one wrote: it saw a free lock.
    real_look, real_take = ledger.lock, ledger.acquire_lock
    stale_looks, writes = [None], []
    monkeypatch.setattr(ledger, "lock", lambda: stale_looks.pop() if stale_looks else real_look())
    monkeypatch.setattr(
        ledger,
        "acquire_lock",
        lambda record, replacing: writes.append(record.holder) or real_take(record, replacing=replacing),
    )

    with pytest.raises(LockHeldByAnotherRunError, match=f"run {MANUAL} holds"):
        guard(ledger, sfn).hold("the-other-start")

    assert writes == ["the-other-start"], "its conditional write failed, and it looked again"
    lock = real_look()
    assert lock is not None and lock.holder == MANUAL


def test_a_first_state_called_outside_an_execution_cannot_hold_the_lock_and_says_so(ledger: Ledger) -> None:
    with stubbed("s3") as (s3, stub):
        stub.add_response("get_object", {"Body": body(b'{"image": "a.jpg"}\n')})
        preparer = RunPreparer(s3, "bucket", poll_seconds=1, poll_max_seconds=1, lock=guard(ledger, FakeSfn()))

        with pytest.raises(InvalidRunInputError, match=r"no execution name: .*\$\$\.Execution\.Name"):
            preparer.prepare(RunInput(dataset_version="ds-20270301-090000-0badc0de"))
    assert ledger.lock() is None


# ------------------------------------------------------------------ the lease --
def test_the_lease_outlives_the_state_machines_own_timeout() -> None:
    definition = json.loads((ROOT / "statemachine" / "retrain.asl.json").read_text())
    if "TimeoutSeconds" not in definition:
        pytest.skip("statemachine/retrain.asl.json has no top-level TimeoutSeconds yet (issue 27 adds it)")
    timeout = definition["TimeoutSeconds"]

    for default in (
        LOCK_TTL_SECONDS,
        TriggerPolicy().lock_ttl_seconds,
        TriggerSettings.model_fields["lock_ttl_seconds"].default,
        PrepareRunSettings.model_fields["lock_ttl_seconds"].default,
    ):
        assert default > timeout, f"a lease of {default} s may expire while a run of {timeout} s still runs"
