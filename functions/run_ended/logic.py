"""After a run that ended without its failure branch: stop its job, free the lock, tell the team.

A run stopped from the console (or by `retrain runs cancel`, or StopExecution from anywhere), or
one past the state machine's TimeoutSeconds, ends at once: no Catch runs, so its training job
would keep running unseen, nobody would be told, and its lock would wait for the trigger's next
look. Step Functions publishes "Step Functions Execution Status Change" to EventBridge; the
RunEnded rule hands ABORTED, TIMED_OUT and FAILED ones of this stack's state machine to
`RunEnded.handle`, which runs the one clean-up (`cleanup.RunCleanup`): stop the job, free the
lock through ReleaseFunction (which records the run's end, its message owed, and has the trigger
look for new data), and tell the team while that message is owed, through Notify, which sends it
once (`functions/notify/once.py`). A failure branch that finished its work, a duplicated event or
a retry of this function finds the message sent and sends nothing a second time; a retry after a
message that failed finds it owed and sends it. An invocation that still fails after Lambda's two
retries lands in RunEndedFailureQueue, which RunEndedFailuresAlarm watches (template.yaml).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from functions.common.errors import RunCleanupError
from functions.common.models import JobState, RunState
from functions.common.requests import NotifyRequest, ReleaseInput, ReleaseOutcome
from functions.data.models import RunEndMessage
from functions.run_ended.cleanup import JobStop, RunCleanup

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_stepfunctions import SFNClient

    from functions.data.ledger import Ledger

# What each status means to the team (the execution's own error and cause follow when it has them).
WHY = {
    "ABORTED": "the run was stopped (from the console, `retrain runs cancel` or StopExecution)",
    "TIMED_OUT": "the run took longer than the state machine's TimeoutSeconds",
    "FAILED": "the run failed, and its failure branch did not finish the clean-up",
}
ERRORS = {"ABORTED": "States.Aborted", "TIMED_OUT": "States.Timeout", "FAILED": "States.Runtime"}


class ExecutionStatusChange(BaseModel):
    """The event's detail (only what is read)."""

    model_config = ConfigDict(extra="ignore")

    executionArn: str  # noqa: N815  (AWS's field names)
    stateMachineArn: str  # noqa: N815
    name: str
    status: Literal["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"]
    error: str | None = None
    cause: str | None = None


class _NotifyAnswer(BaseModel):
    """What of Notify's answer (`functions/notify/logic.py`'s Notified) the clean-up reads."""

    model_config = ConfigDict(extra="ignore")

    sent: bool  # False: the run end's message had been sent already


class RunEndedOutcome(BaseModel):
    execution: str
    status: str
    job_name: str | None = None
    job_stopped: bool = False
    released: bool  # this call freed the lock (False: the failure branch, a cancel or a twin had)
    told: bool  # this call sent the run end's message (False: it had been sent, or none was owed)
    last_state: str | None = None


@dataclass(frozen=True)
class RunEnded:
    ledger: Ledger
    sagemaker: SageMakerClient
    sfn: SFNClient
    lambda_client: LambdaClient
    notify_function: str
    release_function: str

    def handle(self, change: ExecutionStatusChange) -> RunEndedOutcome:
        if change.status not in WHY:  # the rule sends only these; anything else is left alone
            return RunEndedOutcome(execution=change.name, status=change.status, released=False, told=False)
        cleanup = RunCleanup(
            self.sagemaker, self.ledger.run_job, lambda run: self._release(run, change.status), self._message_owed
        )
        told: list[str | None] = []

        def tell(job: JobStop) -> bool:
            history = self._history(change.executionArn)
            told.append(history.last_state)
            answer = self._invoke(self.notify_function, _failed_request(change, job, history).model_dump(mode="json"))
            return _NotifyAnswer.model_validate(answer).sent

        outcome = cleanup.end(change.name, tell)
        return RunEndedOutcome(
            execution=change.name,
            status=change.status,
            job_name=outcome.job.job_name,
            job_stopped=outcome.job.stopped,
            released=outcome.released,
            told=outcome.told,
            last_state=told[0] if told else None,
        )

    def _release(self, run: str, status: str) -> bool:
        """Through ReleaseFunction, which then has the trigger look for data that came during the run."""
        request = ReleaseInput(holder=run, source=f"RunEndedFunction: the run ended {status}", owes_message=True)
        answer = self._invoke(self.release_function, request.model_dump(mode="json"))
        return ReleaseOutcome.model_validate(answer).released

    def _message_owed(self, run: str) -> bool:
        end = self.ledger.run_end(run)
        return end is not None and end.message is not RunEndMessage.SENT

    def _history(self, execution_arn: str) -> _History:
        """The run's dataset version (its input) and the state it was in when it ended."""
        # Read forward, all pages: a run's history is short now that no state polls the job (a
        # few dozen events), and moto's engine ignores reverseOrder, which would read it backwards.
        version, last = None, None
        for page in self.sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn):
            for event in page["events"]:
                started = event.get("executionStartedEventDetails")
                if started and version is None:
                    given = json.loads(started.get("input") or "{}")
                    # Not the execution's name: a rerun's name is `<version>-rerun-<time>`.
                    version = given.get("dataset_version") if isinstance(given, dict) else None
                entered = event.get("stateEnteredEventDetails")
                if entered:
                    last = str(entered["name"])
        return _History(dataset_version=version, last_state=last)

    def _invoke(self, function: str, payload: dict[str, Any]) -> Any:
        """Synchronously: a function that fails makes this one fail (its error metric and alarm
        say so), and EventBridge's retries of this asynchronous invocation try again."""
        answer = self.lambda_client.invoke(FunctionName=function, Payload=json.dumps(payload).encode())
        body = answer["Payload"].read().decode(errors="replace")
        if answer.get("FunctionError"):
            raise RunCleanupError(f"{function} failed while cleaning up after the run: {body[:2000]}")
        return json.loads(body or "null")


@dataclass(frozen=True)
class _History:
    dataset_version: str | None
    last_state: str | None


def _failed_request(change: ExecutionStatusChange, job: JobStop, history: _History) -> NotifyRequest:
    cause = WHY[change.status] + (f": {change.cause or change.error}" if change.cause or change.error else "")
    if job.stopped:
        cause += f"; its training job {job.job_name} was stopped"
    state = RunState(
        dataset_version=history.dataset_version,
        failed_state=history.last_state or "unknown",
        error={"Error": change.error or ERRORS[change.status], "Cause": cause},
        job=JobState(job_name=job.job_name, job_arn="", status="Stopped", wait_seconds=0) if job.job_name else None,
    )
    return NotifyRequest(kind="failed", execution=change.name, execution_arn=change.executionArn, state=state)
