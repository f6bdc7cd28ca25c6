"""What each function is invoked with: one request model per function, parsed first thing in its
handler. The state machine's states (`statemachine/retrain.asl.json`) send these; the intake is
invoked with SQS batches (Powertools' batch processor parses them) and the sweeper by its
schedule, whose event carries nothing the sweep needs.

A request that does not have the shape its sender documents fails with `InvalidEventError` (or
`InvalidRunInputError` for a run's input), never retried: it never will have.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from functions.common.errors import InvalidEventError, InvalidRunInputError
from functions.common.models import DatasetVersion, JobState, RunContext, RunName, RunState, SyncState


def _problems(error: ValidationError) -> str:
    """Where and what, without the values (a request may carry a whole run's state)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'the request'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_context=False, include_input=False)
    )


class RunInput(BaseModel):
    """PrepareRun: what starts a retraining run, one frozen dataset version; the first state is
    also given the execution's name and start time (the run's identity)."""

    model_config = ConfigDict(extra="ignore")

    dataset_version: DatasetVersion
    execution: RunName | None = None  # $$.Execution.Name: the run's name
    execution_arn: str | None = None  # $$.Execution.Id: links to the execution
    started_at: datetime | None = None  # $$.Execution.StartTime

    @classmethod
    def parse(cls, event: dict[str, Any]) -> RunInput:
        """The execution's input (`input`, as the state machine passes it, or the bare input) with
        the execution's name and start time."""
        given = event.get("input", event) if isinstance(event.get("input", event), dict) else {}
        context = {key: event[key] for key in ("execution", "execution_arn", "started_at") if key in event}
        try:
            return cls.model_validate({**given, **context})
        except ValidationError as exc:
            raise InvalidRunInputError(
                f"the run input must name a dataset version: {exc.errors(include_url=False)}"
            ) from exc


class SyncRequest(BaseModel):
    """SyncToFsx: start the import, or look at it again."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["start", "check"]
    run: RunContext
    sync: SyncState | None = None


class StartTraining(BaseModel):
    """StartTraining: create this execution's job (a retry finds the one it created)."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["start"]
    run: RunContext


class CheckTraining(BaseModel):
    """WaitForJob's look at the job."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["check"]
    run: RunContext
    job: JobState


class StopTraining(BaseModel):
    """The failure branch's first step: stop the job if one was started."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["stop"]
    state: RunState  # the whole state of the failed run: what got that far


class AwaitTraining(BaseModel):
    """ "Wait for the training job to end" (`.waitForTaskToken`): its task token, to be answered
    when the job ends (`functions/training_job/waiting.py`)."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["await"]
    run: RunContext
    job: JobState
    token: str = Field(min_length=1, max_length=1024)


class SweepWaits(BaseModel):
    """The safety poll's schedule: look at every job a run waits for."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["sweep"]


class JobStateChange(BaseModel):
    """EventBridge's "SageMaker Training Job State Change", as the rule delivers it (the detail
    carries DescribeTrainingJob's fields; only these two are read)."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["event"] = "event"
    job_name: str
    status: str

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> JobStateChange:
        parsed = EventBridgeModel.model_validate(event)
        detail = parsed.detail if isinstance(parsed.detail, dict) else {}
        if not isinstance(detail.get("TrainingJobName"), str) or not isinstance(detail.get("TrainingJobStatus"), str):
            raise InvalidEventError(f"{parsed.detail_type} from {parsed.source} names no training job and status")
        return cls(job_name=detail["TrainingJobName"], status=detail["TrainingJobStatus"])


TrainingRequestType = StartTraining | CheckTraining | StopTraining | AwaitTraining | SweepWaits
TrainingRequest = Annotated[TrainingRequestType, Field(discriminator="action")]
_TRAINING_REQUEST: TypeAdapter[TrainingRequestType] = TypeAdapter(TrainingRequest)


def parse_training_request(event: dict[str, Any]) -> TrainingRequestType | JobStateChange:
    """A state's request (by its `action`), the safety poll's, or an EventBridge event."""
    try:
        if "detail-type" in event:
            return JobStateChange.from_event(event)
        return _TRAINING_REQUEST.validate_python(event)
    except ValidationError as exc:
        raise InvalidEventError(
            f"{event.get('action')} lacks what it needs: {sorted(event)} ({_problems(exc)})"
        ) from exc


class EvaluateRequest(BaseModel):
    """EvaluateRun: the run and the job that completed."""

    model_config = ConfigDict(extra="ignore")

    run: RunContext
    job: JobState


class NotifyRequest(BaseModel):
    """Notify: a run started (optional), finished (EvaluateRun's summary) or failed (its state)."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["started", "finished", "failed"]
    execution: str  # $$.Execution.Name
    execution_arn: str | None = None  # $$.Execution.Id
    summary_uri: str | None = None  # finished: EvaluateRun's summary
    run: RunContext | None = None  # started
    state: RunState | None = None  # failed: the whole state


class TriggerInput(BaseModel):
    """What the trigger is invoked with, from any of its callers.

    - its schedule (EventBridge: `{"source": "aws.events", "detail-type": ...}`), a kick after
      batches close (`{"source": "batch closed", "time": ...}`) and one after a run's lock was
      released (ReleaseFunction's): look for data ready to train on;
    - a person (`retrain runs start`: `{"action": "start", "source": <who>}`): start a run on the
      new data there is now, however little and however recent; every other rule holds (the
      lock, settled batches, held pairs left out, both splits present).

    It frees no lock: the intake and the sweeper may invoke it, and a function cannot tell who
    invoked it. A run's lock is freed by ReleaseFunction (`ReleaseInput`), which only the state
    machine and RunEndedFunction may invoke (IAM).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    action: Literal["look", "start"] = "look"
    source: str = "unknown"
    time: datetime | None = None  # when a kick was sent

    @classmethod
    def parse(cls, event: Any) -> TriggerInput:
        if isinstance(event, dict) and event.get("action") == "release":
            raise InvalidEventError(
                "the trigger frees no lock: a run's lock is released by ReleaseFunction, which only the "
                "state machine and RunEndedFunction may invoke"
            )
        try:
            return cls.model_validate(event)
        except ValidationError as exc:
            raise InvalidEventError(
                f"the trigger's input is not a schedule, kick or start: "
                f"{exc.errors(include_url=False, include_context=False)}"
            ) from exc


class TriggerOutcome(BaseModel):
    """What the trigger answers: the run it started, and why (not)."""

    started: RunName | None  # the run started, if any
    reason: str


class ReleaseInput(BaseModel):
    """ReleaseFunction: free the lock `holder` holds, by name, then have the trigger look for new
    data. Sent by the state machine's last states and by RunEndedFunction (and `retrain runs
    cancel`, with an operator's own credentials); no other principal of the stack may invoke it.

    `owes_message`: the caller tells the team how the run ended after this release (the failure
    branch, RunEndedFunction, a cancel). The release then records the run's end in the same
    transaction, its message owed, and that record decides who sends the one message
    (`functions/notify/once.py`). The finished run's last state told the team before it
    released: it owes none.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    holder: RunName
    source: str = Field(min_length=1, max_length=512)  # who releases, and why: recorded with the end
    owes_message: bool

    @classmethod
    def parse(cls, event: Any) -> ReleaseInput:
        try:
            return cls.model_validate(event)
        except ValidationError as exc:
            raise InvalidEventError(f"a release names its holder, source and owes_message: {_problems(exc)}") from exc


class ReleaseOutcome(BaseModel):
    """What ReleaseFunction answers: whether this call freed `holder`'s lock (False: it was freed
    before, or another holds it)."""

    holder: RunName
    released: bool
