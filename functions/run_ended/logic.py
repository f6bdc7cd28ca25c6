"""After a run that ended without its failure branch: stop its job, tell the team, free the lock.

A run stopped from the console (or by `retrain runs cancel`, or StopExecution from anywhere), or
one past the state machine's TimeoutSeconds, ends at once: no Catch runs, so its training job
would keep running unseen, nobody would be told, and its lock would wait for the trigger's next
look. Step Functions publishes "Step Functions Execution Status Change" to EventBridge; the
RunEnded rule hands ABORTED, TIMED_OUT and FAILED ones of this stack's state machine to
`RunEnded.handle`.

It is idempotent with the failure branch, which also stops the job, tells the team and releases
the lock, and then ends the execution FAILED: a run whose lock its execution no longer holds
was cleaned up already (or the trigger took the lock over for the next run), so only the job is
looked at again (stopping a stopped job is a no-op). The job is found by the run's name
(`Ledger.run_job`, written before the job was created), not by recomputing its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict

from functions.common.errors import RunCleanupError

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_stepfunctions import SFNClient

    from functions.data.ledger import Ledger

# What each status means to the team (the execution's own error and cause follow when it has them).
WHY = {
    "ABORTED": "the run was stopped (from the console, `retrain runs cancel` or StopExecution)",
    "TIMED_OUT": "the run took longer than the state machine's TimeoutSeconds",
    "FAILED": "the run failed outside its failure branch",
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


class RunEndedOutcome(BaseModel):
    execution: str
    status: str
    job_name: str | None = None
    job_stopped: bool = False
    cleaned_up: bool  # told the team and released the lock (False: the failure branch had)
    last_state: str | None = None


@dataclass(frozen=True)
class RunEnded:
    ledger: Ledger
    sagemaker: SageMakerClient
    sfn: SFNClient
    lambda_client: LambdaClient
    notify_function: str
    trigger_function: str

    def handle(self, change: ExecutionStatusChange) -> RunEndedOutcome:
        job_name = self.ledger.run_job(change.name)
        stopped = self._stop(job_name) if job_name else False
        lock = self.ledger.lock()
        if change.status not in WHY or lock is None or lock.holder != change.name:
            return RunEndedOutcome(
                execution=change.name, status=change.status, job_name=job_name, job_stopped=stopped, cleaned_up=False
            )
        last_state = self._last_state(change.executionArn)
        cause = WHY[change.status] + (f": {change.cause or change.error}" if change.cause or change.error else "")
        if stopped:
            cause += f"; its training job {job_name} was stopped"
        state: dict[str, Any] = {
            "dataset_version": change.name,
            "failed_state": last_state or "unknown",
            "error": {"Error": change.error or ERRORS[change.status], "Cause": cause},
        }
        if job_name:
            state["job"] = {"job_name": job_name, "job_arn": "", "status": "Stopped", "wait_seconds": 0}
        self._invoke(
            self.notify_function,
            {"kind": "failed", "execution": change.name, "execution_arn": change.executionArn, "state": state},
        )
        self._invoke(
            self.trigger_function,
            {"action": "release", "holder": change.name, "source": f"the run ended {change.status}"},
        )
        return RunEndedOutcome(
            execution=change.name,
            status=change.status,
            job_name=job_name,
            job_stopped=stopped,
            cleaned_up=True,
            last_state=last_state,
        )

    def _stop(self, job_name: str) -> bool:
        try:
            status = self.sagemaker.describe_training_job(TrainingJobName=job_name)["TrainingJobStatus"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ValidationException":
                return False  # recorded, never created
            raise
        if status != "InProgress":
            return False
        self.sagemaker.stop_training_job(TrainingJobName=job_name)
        return True

    def _last_state(self, execution_arn: str) -> str | None:
        """The state the run was in when it ended (what the team is told it was doing)."""
        # Read forward, all pages: a run's history is short now that no state polls the job (a
        # few dozen events), and moto's engine ignores reverseOrder, which would read it backwards.
        last = None
        for page in self.sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn):
            for event in page["events"]:
                entered = event.get("stateEnteredEventDetails")
                if entered:
                    last = str(entered["name"])
        return last

    def _invoke(self, function: str, payload: dict[str, Any]) -> None:
        """Synchronously: a function that fails makes this one fail, and EventBridge's retries of
        this asynchronous invocation try again (both steps are idempotent)."""
        answer = self.lambda_client.invoke(FunctionName=function, Payload=json.dumps(payload).encode())
        if answer.get("FunctionError"):
            body = answer["Payload"].read().decode(errors="replace")[:2000]
            raise RunCleanupError(f"{function} failed while cleaning up after the run: {body}")
