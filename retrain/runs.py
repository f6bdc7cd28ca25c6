"""What `retrain runs` knows: the runs of a stack, one run in full, a rerun and a cancel.

A run is one execution of the retraining state machine; its name is the run's name, and its
summary.json says how it ended: `reports/failures/<run>/` for a run that failed or was stopped
before its evaluation, `reports/runs/<run>/` for an evaluated one. The clients are injected, so the same logic
works against a deployed stack and against the offline one.

A cancel stops the execution (so the run cannot go on to start a job or tell the team a second
time). StopExecution ends an execution without running its Catch, and RunEndedFunction, which
hears every such end, stops the training job, tells the team the run was stopped and by whom
(the stop's cause), and frees the lock: the cancel waits for that and says what it saw, and does
it itself only if RunEndedFunction did not, freeing the lock through the stack's ReleaseFunction
(with the operator's own credentials: `lambda:InvokeFunction` on it) as RunEndedFunction does.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from functions.common import prefixes
from functions.common.errors import RetrainError
from functions.common.models import RunContext, RunState
from functions.common.requests import NotifyRequest, ReleaseInput, ReleaseOutcome, TriggerInput, TriggerOutcome
from functions.common.summary import RunSummary
from functions.data.ledger import Ledger
from functions.data.models import RunEndMessage
from functions.data.run_lock import RunLock
from functions.notify.logic import Notified, Notifier
from functions.notify.once import OneMessage
from functions.notify.render import HEADLINES
from functions.run_ended.cleanup import JobStop, RunCleanup, job_status
from functions.trigger.logic import Trigger

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_stepfunctions import SFNClient

CANCELLED = "RunCancelled"  # the error a cancelled run's execution and summary carry
RERUN_SUFFIX = "-rerun-"
MAX_EXECUTION_NAME = 80
ACTIVE_JOB = frozenset({"InProgress", "Stopping"})
# How long a cancel's claim on the run end's message lasts: sending takes seconds; should this
# process die meanwhile, RunEndedFunction's retries (or another cancel) send it after this.
CANCEL_CLAIM_SECONDS = 300.0


class RunNotFoundError(RetrainError):
    """No execution of the state machine has this name."""


class RunNotRunningError(RetrainError):
    """The run has already ended: there is nothing to cancel."""


class TriggerFailedError(RetrainError):
    """The trigger function (or the release function) was invoked but failed: its error, as Lambda
    returned it."""


class RunRow(BaseModel):
    """One line of `retrain runs list`."""

    run: str
    dataset_version: str | None
    status: str  # the execution's: RUNNING, SUCCEEDED, FAILED, ABORTED, TIMED_OUT
    outcome: str | None  # the summary's: accepted, rejected, failed, stopped (None: none yet)
    started_at: datetime
    duration_seconds: float | None
    miou: float | None
    miou_change: float | None
    gate: str | None  # accepted / rejected and the first reason


class RunDetails(BaseModel):
    run: str
    execution_arn: str
    status: str
    dataset_version: str | None
    started_at: datetime
    stopped_at: datetime | None
    current_state: str | None  # for a running run: the state it is in
    job_name: str | None
    summary: RunSummary | None


class CancelOutcome(BaseModel):
    run: str
    cleaned_up_by: Literal["RunEndedFunction", "this command"]
    job_name: str | None
    job_status: str | None  # the job's status when the cancel ended
    told_team: bool = False
    summary_uri: str | None = None


@dataclass
class Runs:
    sfn: SFNClient
    s3: S3Client
    bucket: str
    state_machine_arn: str
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    # ---------------------------------------------------------------- reading --
    def execution_arn(self, run: str) -> str:
        return f"{self.state_machine_arn.replace(':stateMachine:', ':execution:')}:{run}"

    def executions(self, limit: int) -> Iterator[dict[str, Any]]:
        """Newest first, as Step Functions lists them."""
        seen = 0
        for page in self.sfn.get_paginator("list_executions").paginate(stateMachineArn=self.state_machine_arn):
            for execution in sorted(page["executions"], key=lambda e: e["startDate"], reverse=True):
                if seen >= limit:
                    return
                seen += 1
                yield dict(execution)

    def summary(self, run: str) -> RunSummary | None:
        """The run's summary.json: its failure's if it has one, else its evaluation's."""
        for key in prefixes.summary_keys(run):
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                    continue
                raise
            try:
                return RunSummary.model_validate_json(body)
            except ValidationError:
                return None  # a summary of another schema: the row still shows the execution
        return None

    def rows(self, limit: int = 20) -> list[RunRow]:
        rows = []
        for execution in self.executions(limit):
            run = execution["name"]
            summary = self.summary(run) if execution["status"] != "RUNNING" else None
            started = execution["startDate"]
            ended = execution.get("stopDate")
            duration = summary.duration_seconds if summary and summary.duration_seconds is not None else None
            if duration is None:
                duration = ((ended or self.clock()) - started).total_seconds()
            gate = None
            if summary is not None and summary.gate is not None:
                verdict = "accepted" if summary.gate.accepted else "rejected"
                gate = f"{verdict}: {summary.gate.reasons[0]}" if summary.gate.reasons else verdict
            version = summary.dataset_version if summary else self._input_version(execution["executionArn"])
            rows.append(
                RunRow(
                    run=run,
                    dataset_version=version,
                    status=execution["status"],
                    outcome=summary.outcome if summary else None,
                    started_at=started,
                    duration_seconds=duration,
                    miou=summary.miou if summary else None,
                    miou_change=summary.gate.miou_change if summary and summary.gate else None,
                    gate=gate,
                )
            )
        return rows

    def _input_version(self, execution_arn: str) -> str | None:
        """The dataset version a run was started on (runs without a summary: running ones)."""
        described = self.sfn.describe_execution(executionArn=execution_arn)
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return str(json.loads(described.get("input") or "{}")["dataset_version"])
        return None

    def details(self, run: str) -> RunDetails:
        arn = self.execution_arn(run)
        try:
            described = self.sfn.describe_execution(executionArn=arn)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
                raise RunNotFoundError(f"there is no run {run} (no execution of {self.state_machine_arn})") from error
            raise
        state, current = self.state_of(arn)
        version = self._input_version(arn)
        return RunDetails(
            run=run,
            execution_arn=arn,
            status=described["status"],
            dataset_version=version,
            started_at=described["startDate"],
            stopped_at=described.get("stopDate"),
            current_state=current if described["status"] == "RUNNING" else None,
            job_name=state.job.job_name if state.job else None,
            summary=self.summary(run),
        )

    def state_of(self, execution_arn: str) -> tuple[RunState, str | None]:
        """The run's state document as its last state left it, and the state it is in now."""
        document: RunState | None = None
        current = None
        events: list[Any] = []
        # Read forward and walk back: moto ignores `reverseOrder`, and a run's history is small
        # (polling is capped at about 1,000 looks).
        for page in self.sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn):
            events.extend(page["events"])
        for event in sorted(events, key=lambda e: e["id"], reverse=True):
            if current is None and "stateEnteredEventDetails" in event:
                current = event["stateEnteredEventDetails"]["name"]
            exited = event.get("stateExitedEventDetails")
            if document is None and exited is not None:
                document = run_state(exited.get("output"))
            if document is not None and current is not None:
                break
        return document or RunState(), current

    def dataset_version(self, run: str) -> str:
        version = self.details(run).dataset_version
        if version is None:
            raise RunNotFoundError(f"run {run}'s input names no dataset version")
        return version

    # --------------------------------------------------------------- steering --
    def rerun(self, run: str, trigger: Trigger) -> TriggerOutcome:
        """A new run on `run`'s dataset version, through the trigger's lock."""
        version = self.dataset_version(run)
        return trigger.rerun(version, rerun_name(version, self.clock()))

    def cancel(
        self,
        run: str,
        *,
        sagemaker: SageMakerClient,
        ledger: Ledger,
        notifier: Notifier | None,
        who: str,
        release: Callable[[str], bool],
        job_timeout: float = 120.0,
        progress: Callable[[str], None] = lambda _: None,
    ) -> CancelOutcome:
        """Stop the execution; RunEndedFunction, which every end of a run reaches, then stops the
        job, frees the lock and tells the team. This waits up to `job_timeout` for that and says
        what happened; only if it did not all happen (the rule disabled, the function failing)
        does it do the same itself, by the same rule (`functions/run_ended/cleanup.py`): `release`
        frees the run's lock owing the message (`release_through` the stack's ReleaseFunction),
        and the message goes out if it is still owed, whoever freed the lock, once. So a cancel
        never leaves a job training, a lock held or the team untold."""
        arn = self.execution_arn(run)
        details = self.details(run)
        if details.status != "RUNNING":
            raise RunNotRunningError(f"run {run} has already ended ({details.status}): nothing to cancel")
        state, current = self.state_of(arn)
        cause = f"cancelled by {who} with `retrain runs cancel`"
        _stop_execution(self.sfn, arn, cause)
        progress(f"stopped the execution (it was in {current!r})")
        job_name = details.job_name or ledger.run_job(run)
        lock = RunLock(ledger, self.clock)

        def owed(name: str) -> bool:
            end = ledger.run_end(name)
            return end is not None and end.message is not RunEndMessage.SENT

        progress("waiting for RunEndedFunction to stop the job, release the lock and tell the team")
        deadline = time.monotonic() + job_timeout
        job_status = _job_status(sagemaker, job_name)
        while time.monotonic() < deadline and (lock.holds(run) or job_status in ACTIVE_JOB or owed(run)):
            time.sleep(1)
            job_status = _job_status(sagemaker, job_name)
        if not lock.holds(run) and not owed(run):
            if job_name is not None:
                progress(f"training job {job_name}: {job_status}")
            progress("released the lock")
            summary = self.summary(run)
            told_team = ledger.run_end(run) is not None  # recorded, and no longer owed: sent
            if told_team and summary is not None:
                progress(f"told the team: {HEADLINES[summary.outcome]} (RunEndedFunction)")
            return CancelOutcome(
                run=run,
                cleaned_up_by="RunEndedFunction",
                job_name=job_name,
                job_status=job_status,
                told_team=told_team,
                summary_uri=summary.artifacts.summary if summary else None,
            )
        progress(f"RunEndedFunction did not clean up within {job_timeout:.0f} s: doing it here")
        cleanup = RunCleanup(sagemaker, lambda _: job_name, release, owed)
        if job_name is not None:
            job_status = _wait_for_stop(sagemaker, cleanup.stop_job(run), job_timeout, progress)
        told: list[Notified] = []

        def tell(_: JobStop) -> bool:
            if notifier is None:
                progress("the team is still owed the message about this run's end (--no-notify)")
                return False
            failed = state.model_copy(
                update={
                    "failed_state": current or "unknown",
                    "error": {"Error": CANCELLED, "Cause": cause},
                    "run": state.run or _context_from(details),
                }
            )
            # Sent through the run-end record, so that RunEndedFunction, if it is only late, sends
            # nothing a second time (and the other way round).
            once = OneMessage(ledger, self.clock, lambda: CANCEL_CLAIM_SECONDS)
            notified = replace(notifier, once=once).notify(
                NotifyRequest(kind="failed", execution=run, execution_arn=arn, state=failed)
            )
            if notified.sent:
                told.append(notified)
                progress(f"told the team: {notified.subject}")
            else:
                progress("RunEndedFunction told the team meanwhile")
            return notified.sent

        outcome = cleanup.end(run, tell)
        progress("released the lock" if outcome.released else "the lock was released meanwhile")
        return CancelOutcome(
            run=run,
            cleaned_up_by="this command" if outcome.released or outcome.told else "RunEndedFunction",
            job_name=job_name,
            job_status=job_status,
            told_team=outcome.told or not owed(run),
            summary_uri=told[0].summary_uri if told else None,
        )


def start_now(lambda_client: LambdaClient, function_name: str, who: str) -> TriggerOutcome:
    """Ask the stack's own trigger to start a run on the new data there is now (`retrain runs
    start`). The deployed function decides, with its settings (split, settle time, lock), so a run
    started by hand is frozen exactly as a scheduled one; only the count and the delay are waived."""
    request = TriggerInput(action="start", source=f"retrain runs start ({who})")
    payload = _invoke(lambda_client, function_name, "trigger", request.model_dump_json(exclude_defaults=True))
    try:
        return TriggerOutcome.model_validate_json(payload)
    except ValidationError as error:
        raise TriggerFailedError(f"the trigger function {function_name} answered {payload[:200]!r}: {error}") from None


def release_through(lambda_client: LambdaClient, function_name: str, who: str) -> Callable[[str], bool]:
    """Free a run's lock as RunEndedFunction does, through the stack's ReleaseFunction (which then
    has the trigger look for new data): True only for the call that freed it."""

    def release(run: str) -> bool:
        request = ReleaseInput(holder=run, source=f"retrain runs cancel ({who})", owes_message=True)
        payload = _invoke(lambda_client, function_name, "release", request.model_dump_json())
        try:
            return ReleaseOutcome.model_validate_json(payload).released
        except ValidationError as error:
            raise TriggerFailedError(
                f"the release function {function_name} answered {payload[:200]!r}: {error}"
            ) from None

    return release


def _invoke(lambda_client: LambdaClient, function_name: str, what: str, payload: str) -> bytes:
    """The function's answer; its own failure, as Lambda returned it, is a TriggerFailedError."""
    response = lambda_client.invoke(
        FunctionName=function_name, InvocationType="RequestResponse", Payload=payload.encode()
    )
    answer = response["Payload"].read()
    if response.get("FunctionError"):
        try:
            error = json.loads(answer)
            detail = f"{error.get('errorType', 'Error')}: {error.get('errorMessage', '')}"
        except (json.JSONDecodeError, AttributeError):
            detail = answer.decode(errors="replace")[:500]
        raise TriggerFailedError(f"the {what} function {function_name} failed: {detail}")
    return answer


def rerun_name(version: str, now: datetime) -> str:
    """`<version>-rerun-<UTC time>`: a valid execution name that says what it reruns."""
    suffix = f"{RERUN_SUFFIX}{now:%Y%m%d-%H%M%S}"
    return f"{version[: MAX_EXECUTION_NAME - len(suffix)]}{suffix}"


def run_state(output: str | None) -> RunState | None:
    """The run's state document in a state's output (history JSON), or None when it is not one."""
    try:
        return RunState.model_validate(json.loads(output or "null") or {})
    except (ValueError, ValidationError):
        return None


def _context_from(details: RunDetails) -> RunContext | None:
    if details.dataset_version is None:
        return None
    return RunContext(
        run=details.run,
        execution_arn=details.execution_arn,
        dataset_version=details.dataset_version,
        manifest_uri="",
        manifest_version_id=None,
        pair_count=0,
        started_at=details.started_at,
    )


def _stop_execution(sfn: SFNClient, arn: str, cause: str) -> None:
    try:
        sfn.stop_execution(executionArn=arn, error=CANCELLED, cause=cause)
    except ClientError as error:
        # It ended between our look and the stop: what it left is handled like any end.
        if error.response.get("Error", {}).get("Code") != "ExecutionDoesNotExist":
            raise


def _job_status(sagemaker: SageMakerClient, name: str | None) -> str | None:
    return job_status(sagemaker, name) if name is not None else None


def _wait_for_stop(
    sagemaker: SageMakerClient, job: JobStop, timeout: float, progress: Callable[[str], None]
) -> str | None:
    """Wait up to `timeout` for the job the clean-up asked to stop (or found ended) to be Stopped."""
    assert job.job_name is not None
    if job.stopped:
        progress(f"asked training job {job.job_name} to stop")
    status, deadline = job.status, time.monotonic() + timeout
    while status in {"InProgress", "Stopping"} and time.monotonic() < deadline:
        time.sleep(1)
        status = job_status(sagemaker, job.job_name)
    progress(f"training job {job.job_name}: {status}")
    return status
