"""The one clean-up at a run's end (`functions/run_ended/cleanup.py`): stop the job, free the lock
owing the message, and tell the team exactly once, however often and from wherever the end comes,
and whatever fails on the way.

RunEndedFunction's logic on moto's DynamoDB (the template's ledger table): Lambda is a fake that
hands ReleaseFunction's request to the real release (`functions/release/logic.py`, the real
`RunLock`) and Notify's to the real notifier, which sends through the run's end record
(`functions/notify/once.py`) to an SNS outbox that can be slow or down. SageMaker and Step
Functions are fakes with the answers each story needs. The state machine's failure branch is
played by the same two functions, in its order (tests/unit/test_template.py checks the ASL); a
cancel racing RunEndedFunction on the offline stack is tests/integration/test_run_ends.py.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from functions.common.errors import RunCleanupError, RunEndMessagePendingError
from functions.common.requests import NotifyRequest, ReleaseInput
from functions.data.ledger import Ledger
from functions.data.models import RunEndMessage
from functions.data.run_lock import RunLock
from functions.notify.logic import Notifier
from functions.notify.once import OneMessage
from functions.release.logic import Release
from functions.run_ended.logic import ExecutionStatusChange, RunEnded
from tests.conftest import load_event
from tests.unit.fakes import FakeS3

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:retrain-retrain"
VERSION = "ds-20270301-080000-0badc0de"
RERUN = f"{VERSION}-rerun-20270301-085000"
JOB = "retrain-ds-20270301-080000-0badc0de"
FAILURE_BRANCH = "the state machine's failure branch"


class AtomicCalls:
    """The DynamoDB client, one call at a time: DynamoDB applies each conditional write atomically,
    moto in-process does not lock its tables (a condition checked in one thread could be overtaken
    by another's write before it is applied)."""

    def __init__(self, client: Any) -> None:
        self._client, self._lock = client, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)

        return call


@dataclass
class Outbox:
    """The team's SNS topic: what was published, after `pause_seconds` (a slow send), or a failure."""

    published: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    pause_seconds: float = 0.0

    def publish(self, **message: Any) -> dict[str, Any]:
        time.sleep(self.pause_seconds)
        if self.down:
            raise ConnectionError("SNS is down")
        self.published.append(message)
        return {"MessageId": f"m-{len(self.published)}"}


@dataclass
class Kicks:
    reasons: list[str] = field(default_factory=list)

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


@dataclass
class FakeLambda:
    """ReleaseFunction and Notify as RunEndedFunction invokes them: each request goes to the real
    logic; a handler's exception comes back as Lambda's FunctionError."""

    release: Release
    notifier: Notifier
    requests: list[NotifyRequest] = field(default_factory=list)

    def invoke(self, *, FunctionName: str, Payload: bytes) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        payload = json.loads(Payload)
        try:
            if FunctionName == "release":
                answer = self.release.handle(ReleaseInput.model_validate(payload)).model_dump()
            else:
                assert FunctionName == "notify", FunctionName
                request = NotifyRequest.model_validate(payload)
                self.requests.append(request)
                answer = self.notifier.notify(request, now=NOW).model_dump(mode="json")
        except Exception as error:
            failed = {"errorMessage": str(error), "errorType": type(error).__name__}
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": io.BytesIO(json.dumps(failed).encode())}
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(answer).encode())}


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
    outbox: Outbox
    kicks: Kicks
    sagemaker: FakeSageMaker
    run_ended: RunEnded

    def failure_branch(self, run: str = VERSION) -> None:
        """The state machine's failure branch after its job was stopped: release owing the
        message, then tell, through the same two functions (a failed message fails the state)."""
        release = ReleaseInput(holder=run, source=FAILURE_BRANCH, owes_message=True)
        self.lambda_.release.handle(release)
        failed = NotifyRequest(kind="failed", execution=run, state=load_event("run_failed_state.json"))
        self.lambda_.notifier.notify(failed, now=NOW)


@pytest.fixture
def ledger(ledger: Ledger) -> Ledger:
    """The fixture's ledger, its calls one at a time as DynamoDB applies them (`AtomicCalls`)."""
    return Ledger(AtomicCalls(boto3.client("dynamodb", region_name="us-east-1")), "ledger")  # type: ignore[arg-type]


def story(ledger: Ledger, run: str = VERSION, *, version: str = VERSION, wait_seconds: float = 5.0) -> Story:
    lock = RunLock(ledger, lambda: NOW)
    assert lock.take(run, 3600, over=None, dataset_version=version) is not None
    ledger.record_run_job(run, JOB)
    outbox, kicks, sagemaker = Outbox(), Kicks(), FakeSageMaker()
    notifier = Notifier(
        s3=FakeS3(),  # type: ignore[arg-type]
        sns=outbox,  # type: ignore[arg-type]
        sts=None,  # type: ignore[arg-type]  # no report to sign a link to
        bucket="retrain-data",
        topic_arn="arn:aws:sns:us-east-1:123456789012:retrain",
        region="us-east-1",
        report_reader_role_arn="",
        webhook=lambda: None,
        once=OneMessage(ledger, lambda: NOW, lambda: 60.0, wait_seconds=wait_seconds, poll_seconds=0.05),
    )
    lambda_ = FakeLambda(Release(lock, kicks), notifier)  # type: ignore[arg-type]
    run_ended = RunEnded(ledger, sagemaker, FakeHistory(version), lambda_, "notify", "release")  # type: ignore[arg-type]
    return Story(ledger, lock, lambda_, outbox, kicks, sagemaker, run_ended)


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

    assert (first.released, first.told, second.released, second.told) == (True, True, False, False)
    assert len(s.outbox.published) == 1, "one message per run end"
    (message,) = s.lambda_.requests
    assert message.kind == "failed" and message.execution == VERSION
    assert message.state is not None and message.state.error is not None
    assert "an operator stopped it" in message.state.error["Cause"] and JOB in message.state.error["Cause"]
    assert message.state.failed_state == "Wait for the training job"
    assert s.sagemaker.stops == 1 and first.job_stopped and not second.job_stopped
    assert ledger.lock() is None
    end = ledger.run_end(VERSION)
    assert end is not None and end.message is RunEndMessage.SENT and end.message_id == "m-1"
    assert end.freed_by == "RunEndedFunction: the run ended ABORTED"
    assert s.kicks.reasons, "the trigger was asked to look for new data"


def test_a_duplicated_run_end_event_delivered_at_the_same_moment_sends_one_message(ledger: Ledger) -> None:
    """Three invocations at once (a retry beside two redeliveries), the message slow to send: one
    frees the lock, one claims the message; the others wait for it and send nothing."""
    s = story(ledger)
    s.outbox.pause_seconds = 0.3
    outcomes: list[tuple[bool, bool]] = []
    start = threading.Barrier(3)

    def handle() -> None:
        start.wait()
        outcome = s.run_ended.handle(ended())
        outcomes.append((outcome.released, outcome.told))

    threads = [threading.Thread(target=handle) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(outcomes) == 3, "every invocation ended without an error"
    assert sorted(released for released, _ in outcomes) == [False, False, True]
    assert sorted(told for _, told in outcomes) == [False, False, True]
    assert len(s.outbox.published) == 1, "one message per run end"
    end = ledger.run_end(VERSION)
    assert end is not None and end.message is RunEndMessage.SENT
    assert ledger.lock() is None


def test_a_message_that_cannot_be_sent_after_the_release_is_sent_by_the_retry_and_only_once(ledger: Ledger) -> None:
    """The lock is freed and the run's end recorded; the message fails: RunEndedFunction fails
    (Lambda retries it), the message stays owed, and the retry sends it. A later retry sends nothing."""
    s = story(ledger)
    s.outbox.down = True

    with pytest.raises(RunCleanupError, match=r"notify failed while cleaning up after the run: .*SNS is down"):
        s.run_ended.handle(ended())
    end = ledger.run_end(VERSION)
    assert ledger.lock() is None and end is not None and end.message is RunEndMessage.OWED, "given back, owed"

    s.outbox.down = False
    retried = s.run_ended.handle(ended())
    again = s.run_ended.handle(ended())

    assert (retried.released, retried.told) == (False, True)
    assert (again.released, again.told) == (False, False)
    assert len(s.outbox.published) == 1
    assert s.outbox.published[0]["Subject"].startswith("Retraining stopped")
    assert s.sagemaker.stops == 1


def test_after_a_failure_branch_that_told_the_team_the_failed_event_sends_nothing(ledger: Ledger) -> None:
    s = story(ledger)
    s.sagemaker.status = "Stopped"  # the branch stopped it
    s.failure_branch()
    assert len(s.outbox.published) == 1, "the branch's own message"

    outcome = s.run_ended.handle(ended(status="FAILED", cause="RetrainFailed"))

    assert (outcome.released, outcome.told) == (False, False)
    assert len(s.outbox.published) == 1
    end = ledger.run_end(VERSION)
    assert end is not None and end.freed_by == FAILURE_BRANCH and end.message is RunEndMessage.SENT


def test_when_the_failure_branchs_message_failed_the_failed_event_sends_it(ledger: Ledger) -> None:
    """The branch freed the lock owing the message and could not send it (its state's Catch goes
    on to "Run failed"): RunEndedFunction, hearing the execution end FAILED, sends it."""
    s = story(ledger)
    s.sagemaker.status = "Stopped"
    s.outbox.down = True
    with pytest.raises(ConnectionError):
        s.failure_branch()
    s.outbox.down = False

    outcome = s.run_ended.handle(ended(status="FAILED", cause="the FSx import failed"))

    assert (outcome.released, outcome.told) == (False, True)
    (email,) = s.outbox.published
    assert email["Subject"].startswith("Retraining failed")
    assert "the FSx import failed" in email["Message"]


def test_a_run_refused_before_it_held_the_lock_is_told_by_its_failure_branch_alone(ledger: Ledger) -> None:
    s = story(ledger)
    assert s.lock.release(VERSION), "another run's end, say: this run never held the lock"
    s.failure_branch()  # its release finds no lock: nothing recorded, its message is the one

    outcome = s.run_ended.handle(ended(status="FAILED", cause="RetrainFailed"))

    assert (outcome.released, outcome.told) == (False, False)
    assert len(s.outbox.published) == 1 and ledger.run_end(VERSION) is None


def test_when_the_failure_branch_could_not_free_the_lock_the_failed_event_does_it_and_tells(ledger: Ledger) -> None:
    s = story(ledger)
    s.sagemaker.status = "Stopped"  # the branch stopped it before its release failed

    outcome = s.run_ended.handle(ended(status="FAILED", cause="the FSx import failed"))

    assert outcome.released and outcome.told and not outcome.job_stopped
    (message,) = s.lambda_.requests
    assert message.state is not None and message.state.error is not None
    assert message.state.error["Error"] == "States.Runtime"
    assert "failure branch did not finish" in message.state.error["Cause"]
    assert "the FSx import failed" in message.state.error["Cause"]
    assert ledger.lock() is None and len(s.outbox.published) == 1


def test_a_reruns_message_names_the_dataset_version_it_trained_on_not_its_run_name(ledger: Ledger) -> None:
    s = story(ledger, RERUN, version=VERSION)

    s.run_ended.handle(ended(RERUN))

    (message,) = s.lambda_.requests
    assert message.execution == RERUN
    assert message.state is not None and message.state.dataset_version == VERSION


def test_a_duplicate_waits_for_a_sender_that_still_holds_the_claim_and_then_fails_to_be_retried(
    ledger: Ledger,
) -> None:
    """A sender died mid-send (its claim still holds): the duplicate does not take the message for
    sent; it fails, and Lambda's retry (or, after the last, the on-failure queue) comes back to it."""
    s = story(ledger, wait_seconds=0.2)
    assert s.lock.release(VERSION, ended_by="RunEndedFunction: the run ended ABORTED")
    assert ledger.claim_run_end_message(VERSION, "a-dead-sender", now=NOW, until=NOW + timedelta(seconds=70))

    with pytest.raises(RunCleanupError, match=RunEndMessagePendingError.__name__):
        s.run_ended.handle(ended())
    assert s.outbox.published == []

    later = OneMessage(ledger, lambda: NOW + timedelta(seconds=71), lambda: 60.0)
    s.lambda_.notifier = replace(s.lambda_.notifier, once=later)
    retried = s.run_ended.handle(ended())

    assert retried.told and len(s.outbox.published) == 1, "the lapsed claim is taken over"


@pytest.mark.parametrize("status", ["SUCCEEDED", "RUNNING"])
def test_an_end_the_rule_does_not_send_is_left_alone(ledger: Ledger, status: str) -> None:
    s = story(ledger)

    outcome = s.run_ended.handle(ended(status=status))

    assert not outcome.released and not outcome.told and s.outbox.published == [] and s.sagemaker.stops == 0
    assert s.lock.holds(VERSION)
