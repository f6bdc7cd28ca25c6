"""The one clean-up at the end of a run that did not end well, and its one rule.

Three parties can end a run: the state machine's failure branch, `RunEnded` (a run stopped from
the console, by `retrain runs cancel` or past its timeout, where no Catch runs), and `retrain runs
cancel` itself when RunEnded does not come. Each does the same three things in the same order:

1. stop the run's training job if one was created and still runs (found by the name recorded for
   the run, `Ledger.run_job`; stopping is idempotent);
2. free the run's lock, by name (a conditional delete: of several callers, exactly one frees it);
3. only the caller that freed the lock tells the team. So a duplicated end event, a Lambda retry,
   a cancel racing RunEnded, or RunEnded arriving after a failure branch that finished its work,
   sends nothing a second time.

The order is the guarantee: one message per run end. Its cost is that a message that cannot be
sent after the lock was freed is not sent by anyone else: the caller fails loudly instead (the
state machine's "The team could not be told", RunEnded's error metric and its alarm, the cancel's
exit status). The state machine's failure branch follows the same order in ASL
(statemachine/retrain.asl.yaml): it runs while its execution is RUNNING, when nobody else can free
that run's lock, so it tells after any release that did not fail (one that found no lock: a run
refused in its first state never held one), and leaves a failed release, and the message, to
RunEnded. This module is the code of the other two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError
from pydantic import BaseModel

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient

# Training job statuses that a stop still changes.
STOPPABLE = frozenset({"InProgress"})


class JobStop(BaseModel):
    """What happened to the run's training job."""

    job_name: str | None = None  # None: the run never recorded one
    status: str | None = None  # as of the look (None: recorded, never created)
    stopped: bool = False  # this clean-up asked it to stop


class CleanupOutcome(BaseModel):
    job: JobStop
    told: bool  # this caller freed the lock, and so told the team


def job_status(sagemaker: SageMakerClient, job_name: str) -> str | None:
    """The job's status; None for a job recorded for its run but never created."""
    try:
        return sagemaker.describe_training_job(TrainingJobName=job_name)["TrainingJobStatus"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ValidationException":
            return None
        raise


@dataclass(frozen=True)
class RunCleanup:
    sagemaker: SageMakerClient
    # The job name recorded for a run (`Ledger.run_job`), or None.
    job_of: Callable[[str], str | None]
    # Free the run's lock by name; True only for the call that freed it.
    release: Callable[[str], bool]

    def stop_job(self, run: str) -> JobStop:
        job_name = self.job_of(run)
        if job_name is None:
            return JobStop()
        status = job_status(self.sagemaker, job_name)
        if status not in STOPPABLE:
            return JobStop(job_name=job_name, status=status)
        self.sagemaker.stop_training_job(TrainingJobName=job_name)
        return JobStop(job_name=job_name, status="Stopping", stopped=True)

    def end(self, run: str, tell: Callable[[JobStop], None]) -> CleanupOutcome:
        """Stop the job, free the lock, and tell the team only if this call freed it."""
        job = self.stop_job(run)
        if not self.release(run):
            return CleanupOutcome(job=job, told=False)
        tell(job)
        return CleanupOutcome(job=job, told=True)
