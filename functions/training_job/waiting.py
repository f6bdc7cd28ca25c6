"""Waiting for a training job by its events, with one slow safety poll: no run polls its job.

The state "Wait for the training job to end" invokes this function with a Step Functions task
token (`.waitForTaskToken`) and pauses. `await_job` keeps the token in the ledger beside the
job's name, then looks at the job once: a job that ended before the token was kept is answered
at once. From then on the job's end comes back by one of two ways, whichever is first:

- its "SageMaker Training Job State Change" event (EventBridge rule -> `on_event`), seconds after
  the job ends;
- the safety poll (`sweep`, on a schedule), which looks at every waiting job: it sends the end
  of one whose event was lost, stops and fails one past its deadline, and sends a heartbeat for
  the others. The wait state's HeartbeatSeconds is a few sweeps long, so a safety poll that
  stopped working fails the run (and its failure branch stops the job) instead of hanging it.
  Then it stops every job of this stack whose run is over (`orphans.OrphanJobs`).

Answering is `settle`: the same look as the old polling loop's (`TrainingJobs.check`), whose
JobState goes back with SendTaskSuccess, or whose named error goes back with SendTaskFailure (the
state's Catch sends it down the failure branch). The wait is forgotten with a delete conditional
on its token, so a redelivered event, or an event racing the poll, answers nothing twice; an
answer Step Functions refuses because the execution already ended (stopped from the console,
timed out) just forgets the wait.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from functions.common.errors import TrainingJobFailedError, TrainingJobOverdueError, TrainingJobStoppedError
from functions.common.models import JobState, RunContext
from functions.common.requests import AwaitTraining, JobStateChange, SweepWaits
from functions.data.models import WaitingJob
from functions.training_job.orphans import OrphanStop

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient

    from functions.data.ledger import Ledger
    from functions.training_job.orphans import OrphanJobs
    from functions.training_job.run import TrainingJobs

log = logging.getLogger(__name__)

ENDED = frozenset({"Completed", "Failed", "Stopped"})
# Step Functions' answers to a token whose task is over: the execution ended, timed out, or the
# token was answered already.
GONE = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})


class Settled(BaseModel):
    """What one look at a waiting job did."""

    job_name: str
    execution: str
    outcome: Literal["succeeded", "failed", "heartbeat", "waiting", "gone"]
    status: str | None = None
    error: str | None = None


class WaitReport(BaseModel):
    """What an invocation did: the waits it answered or looked at; `ignored` for an event of a
    job no run waits for."""

    settled: list[Settled]
    ignored: bool = False
    # The safety poll's: jobs still InProgress whose run had ended, stopped.
    orphans: list[OrphanStop] = Field(default_factory=list)


@dataclass(frozen=True)
class JobWaits:
    jobs: TrainingJobs
    ledger: Ledger
    sfn: SFNClient
    # The safety poll's second look; None in tests of the waits alone.
    orphans: OrphanJobs | None = None

    def handle(self, request: AwaitTraining | SweepWaits | JobStateChange) -> WaitReport:
        match request:
            case AwaitTraining():
                return WaitReport(settled=[self.await_job(request.run, request.job, request.token)])
            case SweepWaits():
                # The waits first: their heartbeats are sent whatever the orphans' look meets.
                looked = self.sweep()
                return WaitReport(settled=looked, orphans=self.orphans.sweep() if self.orphans is not None else [])
            case JobStateChange():
                settled = self.on_event(request.job_name, request.status)
                return WaitReport(settled=[settled] if settled else [], ignored=settled is None)

    def await_job(self, run: RunContext, job: JobState, token: str) -> Settled:
        """The wait state's start: keep its token, then look once (the job may have ended)."""
        waiting = WaitingJob(
            job_name=job.job_name,
            execution=run.run,
            token=token,
            run=run.model_dump(mode="json"),
            job=job.model_dump(mode="json"),
            since=datetime.now(UTC),
        )
        self.ledger.wait_for_job(waiting)
        return self.settle(waiting, heartbeat=False)

    def on_event(self, job_name: str, status: str) -> Settled | None:
        """A job's state changed; None when no run waits for it (another stack's, or answered)."""
        waiting = self.ledger.waiting_job(job_name)
        if waiting is None or status not in ENDED:
            return None
        return self.settle(waiting, heartbeat=False)

    def sweep(self) -> list[Settled]:
        """The safety poll: every waiting job, looked at; heartbeats for the ones still running."""
        return [self.settle(waiting, heartbeat=True) for waiting in self.ledger.waiting_jobs()]

    def settle(self, waiting: WaitingJob, *, heartbeat: bool) -> Settled:
        run = RunContext.model_validate(waiting.run)
        job = JobState.model_validate(waiting.job)
        base = {"job_name": waiting.job_name, "execution": waiting.execution}
        try:
            looked = self.jobs.check(job, run=run)
        except (TrainingJobFailedError, TrainingJobStoppedError, TrainingJobOverdueError) as error:
            name, cause = type(error).__name__, str(error)[:32768]
            sent = self._send(
                waiting, lambda: self.sfn.send_task_failure(taskToken=waiting.token, error=name, cause=cause)
            )
            return Settled(**base, outcome="failed" if sent else "gone", error=name)
        if looked.phase == "training":
            if not heartbeat:
                return Settled(**base, outcome="waiting", status=looked.status)
            sent = self._send(waiting, lambda: self.sfn.send_task_heartbeat(taskToken=waiting.token), forget=False)
            return Settled(**base, outcome="heartbeat" if sent else "gone", status=looked.status)
        output = json.dumps(looked.model_dump(mode="json"))
        sent = self._send(waiting, lambda: self.sfn.send_task_success(taskToken=waiting.token, output=output))
        return Settled(**base, outcome="succeeded" if sent else "gone", status=looked.status)

    def _send(self, waiting: WaitingJob, send: Callable[[], object], *, forget: bool = True) -> bool:
        """Answer the token; False when Step Functions says its task is over. The wait is then
        forgotten (after an answer too, unless it was a heartbeat)."""
        try:
            send()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in GONE:
                raise
            log.info("the run waiting for %s has ended already: forgetting its wait", waiting.job_name)
            self.ledger.forget_wait(waiting.job_name, waiting.token)
            return False
        if forget:
            self.ledger.forget_wait(waiting.job_name, waiting.token)
        return True
