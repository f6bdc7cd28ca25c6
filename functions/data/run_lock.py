"""The run lock's one rule, for the trigger and for a run's first state (PrepareRun) alike.

The lock (`Ledger.lock`) names its holder: the execution of the retraining state machine it was
taken for (named after its run), or a purge (`purge:<time>-<random>`). A run's lock is held while
its execution is RUNNING, whatever its lease says: a run may train for up to 28 days, and taking
its lock over because a date passed would start a second job beside it. An execution that ended
(succeeded, failed, stopped, timed out) or does not exist (the trigger died between taking the
lock and starting the run) holds nothing. A purge has no execution to ask: its short lease is all
there is, held until it expires.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from functions.data.ledger import Ledger
from functions.data.models import LockRecord

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of the execution `name` of a Standard state machine."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"


def still_held(lock: LockRecord, now: datetime, sfn: SFNClient, state_machine_arn: str) -> bool:
    """Whether `lock` keeps everyone else out now: a purge's unexpired lease, or a run whose
    execution of `state_machine_arn` is RUNNING."""
    if Ledger.is_purge_holder(lock.holder):
        return now < lock.expires_at
    try:
        status = sfn.describe_execution(executionArn=execution_arn(state_machine_arn, lock.holder))["status"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
            return False
        raise
    return status == "RUNNING"
