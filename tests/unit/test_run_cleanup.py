"""The one clean-up at a run's end (`functions/run_ended/cleanup.py`): stop the job, free the lock,
and only the caller that freed it tells the team, however often and from wherever the end comes.

RunEndedFunction's logic on moto's DynamoDB (the template's ledger table, the real `RunLock`);
Lambda is a fake that hands the trigger's release to the real lock and counts Notify's messages,
SageMaker and Step Functions are fakes with the answers each story needs. The state machine's
failure branch follows the same order in ASL (tests/unit/test_template.py), and a cancel racing
RunEndedFunction on the offline stack is tests/integration/test_run_ends.py.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from functions.common.errors import RunCleanupError
from functions.common.requests import NotifyRequest, ReleaseInput, ReleaseOutcome
from functions.data.ledger import Ledger
from functions.data.run_lock import RunLock
from functions.run_ended.logic import ExecutionStatusChange, RunEnded

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:retrain-retrain"
VERSION = "ds-20270301-080000-0badc0de"
RERUN = f"{VERSION}-rerun-20270301-085000"
JOB = "retrain-ds-20270301-080000-0badc0de"


@dataclass
class FakeLambda:
    """ReleaseFunction and Notify as RunEndedFunction invokes them: the release frees the real lock
    (and answers as ReleaseFunction does); Notify's requests are kept, or it fails."""

    lock: RunLock
    told: list[NotifyRequest] = field(default_factory=list)
    notify_fails: bool = False
    # Widens the window between a release and the message, as a slow Lambda would.
    pause_seconds: float = 0.0

    def invoke(self, *, FunctionName: str, Payload: bytes) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        payload = json.loads(Payload)
        if FunctionName == "release":
            request = ReleaseInput.model_validate(payload)
            released = self.lock.release(request.holder)
            time.sleep(self.pause_seconds)
            answer = ReleaseOutcome(holder=request.holder, released=released).model_dump()
            return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(answer).encode())}
        assert FunctionName == "notify", FunctionName
        if self.notify_fails:
            error = {"errorMessage": "SNS is down", "errorType": "NotificationError"}
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": io.BytesIO(json.dumps(error).encode())}
        self.told.append(NotifyRequest.model_validate(payload))
        return {"StatusCode": 200, "Payload": io.BytesIO(b"{}")}


@dataclass
class FakeSageMaker:
    status: str = "InProgress"
    stops: int = 0
    guard: threading.Lock = field(default_factory=threading.Lock)

    def describe_training_job(self, *, TrainingJobName: str) -> dict[str, Any]:  # noqa: N803
        assert TrainingJobName == JOB
        return {"TrainingJobName": JOB, "TrainingJobStatus": self.status}

    def stop_training_job(self, *, TrainingJobName: str) -> None:  # noqa: N803
        with self.guard:
            self.stops += 1
            self.status = "Stopping"


@dataclass
class FakeHistory:
    """GetExecutionHistory of the run: started with its dataset version, then its states."""

    version: str
    states: tuple[str, ...] = ("Check that the dataset version exists", "Start training", "Wait for the training job")

    def get_paginator(self, name: str) -> FakeHistory:
        assert name == "get_execution_history"
        return self

    def paginate(self, *, executionArn: str) -> Iterator[dict[str, Any]]:  # noqa: N803
        started = {"executionStartedEventDetails": {"input": json.dumps({"dataset_version": self.version})}}
        entered = [{"stateEnteredEventDetails": {"name": name}} for name in self.states]
        yield {"events": [started, *entered]}


@dataclass
class Story:
    ledger: Ledger
    lock: RunLock
    lambda_: FakeLambda
    sagemaker: FakeSageMaker
    run_ended: RunEnded


def story(ledger: Ledger, run: str = VERSION, *, version: str = VERSION) -> Story:
    lock = RunLock(ledger, lambda: NOW)
    assert lock.take(run, 3600, over=None, dataset_version=version) is not None
    ledger.record_run_job(run, JOB)
    lambda_, sagemaker = FakeLambda(lock), FakeSageMaker()
    run_ended = RunEnded(ledger, sagemaker, FakeHistory(version), lambda_, "notify", "release")  # type: ignore[arg-type]
    return Story(ledger, lock, lambda_, sagemaker, run_ended)


def ended(
    run: str = VERSION, status: str = "ABORTED", cause: str | None = "an operator stopped it"
) -> ExecutionStatusChange:
    arn = f"{MACHINE.replace(':stateMachine:', ':execution:')}:{run}"
    return ExecutionStatusChange.model_validate(
        {"executionArn": arn, "stateMachineArn": MACHINE, "name": run, "status": status, "cause": cause}
    )


def test_a_duplicated_run_end_event_stops_the_job_frees_the_lock_and_tells_the_team_once(ledger: Ledger) -> None:
    s = story(ledger)

    first = s.run_ended.handle(ended())
    second = s.run_ended.handle(ended())  # EventBridge delivers at least once

    assert (first.cleaned_up, second.cleaned_up) == (True, False)
    assert len(s.lambda_.told) == 1, "one message per run end"
    (message,) = s.lambda_.told
    assert message.kind == "failed" and message.execution == VERSION
    assert message.state is not None and message.state.error is not None
    assert "an operator stopped it" in message.state.error["Cause"] and JOB in message.state.error["Cause"]
    assert message.state.failed_state == "Wait for the training job"
    assert s.sagemaker.stops == 1 and first.job_stopped and not second.job_stopped
    assert ledger.lock() is None


def test_duplicated_run_end_events_handled_at_the_same_moment_tell_the_team_once(ledger: Ledger) -> None:
    """Two invocations at once (a retry beside a redelivery): both stop the job, one frees the lock."""
    s = story(ledger)
    s.lambda_.pause_seconds = 0.2
    outcomes: list[bool] = []
    start = threading.Barrier(3)

    def handle() -> None:
        start.wait()
        outcomes.append(s.run_ended.handle(ended()).cleaned_up)

    threads = [threading.Thread(target=handle) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(outcomes) == [False, False, True]
    assert len(s.lambda_.told) == 1
    assert ledger.lock() is None


def test_after_a_failure_branch_that_freed_the_lock_the_failed_event_sends_nothing(ledger: Ledger) -> None:
    s = story(ledger)
    assert s.lock.release(VERSION), "the failure branch's release (it told the team after it)"

    outcome = s.run_ended.handle(ended(status="FAILED", cause="RetrainFailed"))

    assert not outcome.cleaned_up and s.lambda_.told == []


def test_when_the_failure_branch_could_not_free_the_lock_the_failed_event_does_it_and_tells(ledger: Ledger) -> None:
    s = story(ledger)
    s.sagemaker.status = "Stopped"  # the branch stopped it before its release failed

    outcome = s.run_ended.handle(ended(status="FAILED", cause="the FSx import failed"))

    assert outcome.cleaned_up and not outcome.job_stopped
    (message,) = s.lambda_.told
    assert message.state is not None and message.state.error is not None
    assert message.state.error["Error"] == "States.Runtime"
    assert "failure branch did not finish" in message.state.error["Cause"]
    assert "the FSx import failed" in message.state.error["Cause"]
    assert ledger.lock() is None


def test_a_reruns_message_names_the_dataset_version_it_trained_on_not_its_run_name(ledger: Ledger) -> None:
    s = story(ledger, RERUN, version=VERSION)

    s.run_ended.handle(ended(RERUN))

    (message,) = s.lambda_.told
    assert message.execution == RERUN
    assert message.state is not None and message.state.dataset_version == VERSION


def test_a_message_that_cannot_be_sent_after_the_release_fails_loudly_and_is_not_sent_twice(ledger: Ledger) -> None:
    """The price of one message per run end: the caller that freed the lock is the only one who
    tells, so its failure is raised (RunEndedFunction's errors alarm), and a retry sends nothing."""
    s = story(ledger)
    s.lambda_.notify_fails = True

    with pytest.raises(RunCleanupError, match=r"notify failed while cleaning up after the run: .*SNS is down"):
        s.run_ended.handle(ended())
    s.lambda_.notify_fails = False
    retried = s.run_ended.handle(ended())

    assert not retried.cleaned_up and s.lambda_.told == []
    assert ledger.lock() is None and s.sagemaker.stops == 1


@pytest.mark.parametrize("status", ["SUCCEEDED", "RUNNING"])
def test_an_end_the_rule_does_not_send_is_left_alone(ledger: Ledger, status: str) -> None:
    s = story(ledger)

    outcome = s.run_ended.handle(ended(status=status))

    assert not outcome.cleaned_up and s.lambda_.told == [] and s.sagemaker.stops == 0
    assert s.lock.holds(VERSION)
