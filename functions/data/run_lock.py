"""The run lock: one type, one rule, for everyone who takes it, holds it, frees it or asks who has it.

The lock (`Ledger.lock`, one DynamoDB item) names its holder: the execution of the retraining
state machine it was taken for (named after its run), or a purge (`purge:<time>-<random>`).

The rule, the same for the trigger, a run's first state (PrepareRun), a purge, the trust
commands and the run-end clean-up:

- a purge holds it while its lease lasts (it has no execution to ask);
- a run holds it while its execution is RUNNING, whatever its lease says: a run may train for up
  to 28 days, and taking its lock over because a date passed would start a second job beside it;
- a run whose execution does not exist yet holds it for `STARTING_RUN_SECONDS` after it was
  taken: the trigger takes the lock a moment before it starts the execution named after it, and
  a second trigger looking in between must not take it over; after that the trigger that took it
  has died (no Lambda runs longer) and the lock is free;
- an execution that ended (succeeded, failed, stopped, timed out) holds nothing.

Where no Step Functions client is given (a command run without the stack's state machine), the
lease is all there is to go by, for runs too: an unexpired lease counts as held.

Freeing is by name (`release`, a conditional delete): exactly one caller frees a run's lock. A
caller that still owes the team the run's message (the failure branch, RunEndedFunction, a
cancel) records the run's end with it, in the same transaction, its message owed: the record
then decides who sends that one message (`functions/notify/once.py`, `functions/run_ended/cleanup.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.data.ledger import Ledger
from functions.data.models import LockRecord, RunEnd

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient

# Lambda's longest timeout: no trigger that took a lock is still about to start its run after it.
STARTING_RUN_SECONDS = 15 * 60


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of the execution `name` of a Standard state machine."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"


@dataclass(frozen=True)
class Executions:
    """The retraining state machine's executions, as the lock's rule asks about them."""

    sfn: SFNClient
    state_machine_arn: str

    def status(self, name: str) -> str | None:
        """The execution's status, or None when there is no such execution (yet)."""
        return self.status_at(execution_arn(self.state_machine_arn, name))

    def status_at(self, arn: str) -> str | None:
        """The status of the execution with this ARN, or None when there is no such execution."""
        try:
            return self.sfn.describe_execution(executionArn=arn)["status"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
                return None
            raise


@dataclass(frozen=True)
class RunLock:
    ledger: Ledger
    clock: Callable[[], datetime]
    # None: the lease is all there is to go by (see the module's docstring).
    executions: Executions | None = None

    def current(self) -> LockRecord | None:
        """The lock's record as it is, held or stale."""
        return self.ledger.lock()

    def keeps_out(self, lock: LockRecord) -> bool:
        """Whether `lock` keeps everyone but its holder out now: the rule."""
        now = self.clock()
        if Ledger.is_purge_holder(lock.holder) or self.executions is None:
            return now < lock.expires_at
        status = self.executions.status(lock.holder)
        if status is None:
            return (now - lock.acquired_at).total_seconds() < STARTING_RUN_SECONDS
        return status == "RUNNING"

    def holder(self) -> LockRecord | None:
        """Who holds the lock now; None when it is free (or held by nobody who still counts)."""
        lock = self.current()
        return lock if lock is not None and self.keeps_out(lock) else None

    def holds(self, holder: str) -> bool:
        """Whether the lock's record names `holder` (held or stale: what it has to free)."""
        lock = self.current()
        return lock is not None and lock.holder == holder

    def take(
        self, holder: str, seconds: float, *, over: LockRecord | None, dataset_version: str | None = None
    ) -> LockRecord | None:
        """Take the lock for `holder` (a run, on `dataset_version`) if it is still exactly as read
        (`over`: free, or stale under the rule); None when someone else wrote it between the look
        and this write."""
        now = self.clock()
        record = LockRecord(
            holder=holder,
            acquired_at=now,
            expires_at=now + timedelta(seconds=seconds),
            dataset_version=dataset_version,
        )
        return record if self.replace(record, over=over) else None

    def replace(self, record: LockRecord, *, over: LockRecord | None) -> bool:
        """Write `record` if the lock is still `over` (None: free): a take, or a purge renewing or
        ending its lease under a new holder name."""
        return self.ledger.acquire_lock(record, replacing=over)

    def release(self, holder: str, *, ended_by: str | None = None) -> bool:
        """Free the lock if `holder` has it; True only for the one call that freed it. With
        `ended_by` (who frees it, and still owes the team the run's message), the run's end is
        recorded in the same transaction, its message owed."""
        if ended_by is None:
            return self.ledger.release_lock(holder)
        return self.ledger.release_lock_recording_end(RunEnd(run=holder, freed_by=ended_by, freed_at=self.clock()))
