"""The one clean-up at the end of a run that did not end well, and its one rule.

Three parties can end a run: the state machine's failure branch, `RunEnded` (a run stopped from
the console, by `retrain runs cancel` or past its timeout, where no Catch runs, and a run whose
failure branch did not finish) and `retrain runs cancel` itself when RunEnded does not come. Each
does the same three things in the same order:

1. stop the run's training job if one was created and still runs (found by the name recorded for
   the run, `Ledger.run_job`; stopping is idempotent);
2. free the run's lock, by name, owing the message: a conditional delete that records the run's
   end (`RunEnd`, its message owed) in the same transaction, so of several callers exactly one
   frees it and the end is recorded once;
3. tell the team while the record says the message is owed, through the record's claim
   (`functions/notify/once.py`): whoever sends it first marks it sent, and nobody sends it again.

So a duplicated end event, a Lambda retry, a cancel racing RunEnded, or RunEnded arriving after a
failure branch that finished its work sends nothing a second time; and a message that could not
be sent after the lock was freed stays owed, so the next try sends it (the failed caller's retry,
RunEnded after a failure branch whose message failed, a cancel). The state machine's failure
branch follows the same order in ASL (statemachine/retrain.asl.yaml): its release owes the
message, and its Notify sends through the record. This module is the code of the other two.
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
    released: bool  # this caller freed the lock (and recorded the run's end)
    told: bool  # this caller sent the run end's message


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
    # Free the run's lock by name, recording its end with the message owed; True only for the
    # call that freed it.
    release: Callable[[str], bool]
    # Whether the run's end is recorded with its message still to send (by anyone).
    message_owed: Callable[[str], bool]

    def stop_job(self, run: str) -> JobStop:
        job_name = self.job_of(run)
        if job_name is None:
            return JobStop()
        status = job_status(self.sagemaker, job_name)
        if status not in STOPPABLE:
            return JobStop(job_name=job_name, status=status)
        self.sagemaker.stop_training_job(TrainingJobName=job_name)
        return JobStop(job_name=job_name, status="Stopping", stopped=True)

    def end(self, run: str, tell: Callable[[JobStop], bool]) -> CleanupOutcome:
        """Stop the job, free the lock, and tell the team while the message is owed, whoever
        freed the lock; `tell` answers whether it sent the message (the record's claim decides)."""
        job = self.stop_job(run)
        released = self.release(run)
        told = tell(job) if self.message_owed(run) else False
        return CleanupOutcome(job=job, released=released, told=told)
