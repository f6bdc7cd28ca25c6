"""Training jobs that outlive their run: stopped by "Start training" itself, and by the safety poll.

Step Functions does not stop a Lambda function it is waiting for. A run stopped (from the
console, `retrain runs cancel`, StopExecution) or timed out while its "Start training" state runs
ends at once, and RunEnded looks for the run's job: it finds the name recorded for the run but no
job yet, so it has nothing to stop. A moment later the function, still running, creates the job,
and nobody would stop it before its MaxRuntime (days of GPU instances, for a run that is over).

Two guards close that, both here:

1. `TrainingJobs.start` asks Step Functions about its own execution once the job exists (created,
   or found by a retry), and stops the job of an execution that has ended (`ENDED`). Whoever ended
   the run looked before the job existed; a stop that comes after this look is followed by a
   RunEnded that finds the job and stops it itself.
2. `OrphanJobs.sweep`, on the safety poll's schedule: every InProgress job of this stack (its name
   prefix) whose run, named by the job's `retrain:execution` tag, is no longer RUNNING, or has no
   execution at all, is stopped. It catches what the first guard cannot: a function that timed
   out, crashed or was throttled between its CreateTrainingJob and its look.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from functions.training_job.builder import TAG_EXECUTION

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient

    from functions.data.run_lock import Executions

log = logging.getLogger(__name__)

# The statuses of an execution that has ended: its job has nobody left to wait for it. RUNNING
# and PENDING_REDRIVE (a failed run being redriven) keep their job.
ENDED = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"})


class OrphanStop(BaseModel):
    """An InProgress job of this stack whose run is over, as the sweep found it."""

    job_name: str
    execution: str | None  # the run its tag names; None: it names none, and is left alone
    execution_status: str | None  # None: no such execution (or no run named)
    stopped: bool  # this sweep stopped it (False: it ended meanwhile, or names no run)


def stop_job(sagemaker: SageMakerClient, job_name: str) -> bool:
    """Stop the job; False when SageMaker says it is no longer InProgress (it ended or is
    stopping already: someone else was first)."""
    try:
        sagemaker.stop_training_job(TrainingJobName=job_name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ValidationException":
            return False
        raise
    return True


@dataclass(frozen=True)
class OrphanJobs:
    """This stack's training jobs, as the safety poll sweeps them."""

    sagemaker: SageMakerClient
    executions: Executions
    # `retrain-<stack id>`: the stack's jobs are named `<prefix>-<dataset version>-<hash>`.
    prefix: str

    def sweep(self) -> list[OrphanStop]:
        """Stop every InProgress job of this stack whose run is not RUNNING."""
        found: list[OrphanStop] = []
        for job in self._in_progress():
            name = job["TrainingJobName"]
            execution = self._run_of(job["TrainingJobArn"])
            if execution is None:
                # Every job this stack creates is tagged with its run: this one was made by hand.
                log.warning("training job %s names no run (no %s tag): left alone", name, TAG_EXECUTION)
                found.append(OrphanStop(job_name=name, execution=None, execution_status=None, stopped=False))
                continue
            status = self.executions.status(execution)
            if status is not None and status not in ENDED:
                continue
            stopped = stop_job(self.sagemaker, name)
            log.warning(
                "training job %s outlived its run %s (%s): %s",
                name,
                execution,
                status or "no such execution",
                "stopped" if stopped else "it had ended meanwhile",
            )
            found.append(OrphanStop(job_name=name, execution=execution, execution_status=status, stopped=stopped))
        return found

    def _in_progress(self) -> Iterator[Any]:
        # StatusEquals filters each page after it is read, so a page may come back empty with a
        # NextToken: every page is read. NameContains is no prefix match: the prefix is checked.
        pages = self.sagemaker.get_paginator("list_training_jobs").paginate(
            StatusEquals="InProgress", NameContains=f"{self.prefix}-"
        )
        for page in pages:
            for job in page["TrainingJobSummaries"]:
                if job["TrainingJobName"].startswith(f"{self.prefix}-"):
                    yield job

    def _run_of(self, job_arn: str) -> str | None:
        """The execution name the job was tagged with when it was created (`builder._tags`)."""
        for page in self.sagemaker.get_paginator("list_tags").paginate(ResourceArn=job_arn):
            for tag in page.get("Tags", []):
                if tag["Key"] == TAG_EXECUTION:
                    return tag["Value"]
        return None
