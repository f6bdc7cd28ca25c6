"""One lock, one run (issue 27), on the offline stack: a run that is still RUNNING keeps the lock
after its lease expired, and an operator's manual StartExecution while a run holds the lock is
refused by the run's first state, trains nothing, and leaves the running run its lock.

The run that holds the lock waits an hour in a stand-in machine (the trigger, and PrepareRun,
which asks about the lock's holder, are pointed at it); the refused execution is the stack's real
retraining state machine.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.data.ledger import Ledger
from functions.data.models import LockRecord
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import drain, executions, wait_until
from tests.integration.helpers import create_machine
from tests.integration.runs import history_states, job_names
from tests.integration.test_batches_and_runs import WITH_VALIDATION, drop, trigger


def a_run_holds_the_lock(stack: OfflineStack) -> tuple[dict[str, Any], LockRecord]:
    """A drop whose run waits an hour in a stand-in machine: its execution, and the lock it holds."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    stack.update_function_environment("TriggerFunction", STATE_MACHINE_ARN=machine)
    stack.update_function_environment("PrepareRunFunction", STATE_MACHINE_ARN=machine)
    drop(stack, "first", WITH_VALIDATION)
    drain(stack)
    wait_until(lambda: len(executions(stack)) == 1, message="the first run")
    (run,) = executions(stack)
    lock = ledger_of(stack).lock()
    assert lock is not None and lock.holder == run["name"]
    return run, lock


def ledger_of(stack: OfflineStack) -> Ledger:
    return Ledger(stack.aws.dynamodb, stack.ref("LedgerTable"))


def test_a_run_still_running_after_its_lease_expired_keeps_the_lock_until_it_ends(
    data_stack: OfflineStack,
) -> None:
    run, lock = a_run_holds_the_lock(data_stack)
    ledger = ledger_of(data_stack)
    # As if it had trained past its lease (a 28-day job under the old 7-day lease).
    expired = lock.model_copy(update={"expires_at": datetime.now(UTC) - timedelta(hours=1)})
    assert ledger.acquire_lock(expired, replacing=lock)
    drop(data_stack, "second", range(10, 11))
    drain(data_stack)

    assert trigger(data_stack)["reason"] == f"a run holds the lock: {run['name']}"
    assert [e["name"] for e in executions(data_stack)] == [run["name"]], "no second run beside it"
    assert ledger.lock() == expired

    data_stack.aws.stepfunctions.stop_execution(executionArn=run["executionArn"])
    assert data_stack.wait_for_execution(run["executionArn"])["status"] == "ABORTED"
    after = trigger(data_stack)

    assert after["started"], after
    assert len(executions(data_stack)) == 2
    taken = ledger.lock()
    assert taken is not None and taken.holder == after["started"]


def test_a_manual_start_while_a_run_holds_the_lock_is_refused_and_trains_nothing(
    data_stack: OfflineStack,
) -> None:
    run, lock = a_run_holds_the_lock(data_stack)
    bucket = data_stack.ref("DataBucket")
    # A valid version of its own, as an operator would pick one: frozen, with a manifest.
    version = "ds-20270301-090000-0ba5e11e"
    data_stack.aws.s3.copy_object(
        Bucket=bucket,
        Key=f"dataset/manifests/{version}.jsonl",
        CopySource={"Bucket": bucket, "Key": f"dataset/manifests/{run['name']}.jsonl"},
    )
    inbox = data_stack.topic_inbox()

    started = data_stack.aws.stepfunctions.start_execution(
        stateMachineArn=data_stack.ref("RetrainStateMachine"),
        name="started-by-hand",
        input=json.dumps({"dataset_version": version}),
    )
    ended = data_stack.wait_for_execution(started["executionArn"], timeout=60)

    assert ended["status"] == "FAILED"
    cause = json.loads(ended["cause"])
    assert cause["errorType"] == "LockHeldByAnotherRunError"
    assert cause["errorMessage"] == (
        f"run {run['name']} holds the retraining lock: this execution (started-by-hand) would train beside it; "
        f"start it again when {run['name']} has ended, or use `retrain runs rerun`"
    )
    history = data_stack.history(started["executionArn"])
    failed = [e["lambdaFunctionFailedEventDetails"]["error"] for e in history if e["type"] == "LambdaFunctionFailed"]
    assert failed == ["LockHeldByAnotherRunError"], "refused once, not retried"
    states = history_states(data_stack, started["executionArn"])
    assert "Start training" not in states and job_names(data_stack) == [], "no training job for it"
    assert states[-3:] == [
        "Release the lock after the failure",
        "Tell the team the run failed",
        "Run failed",
    ]
    (message,) = inbox.receive()
    assert "LockHeldByAnotherRunError" in message["Message"]
    assert ledger_of(data_stack).lock() == lock, "its release freed nothing: the lock is not its own"
    holder = data_stack.aws.stepfunctions.describe_execution(executionArn=run["executionArn"])
    assert holder["status"] == "RUNNING", "the running run is unharmed"
