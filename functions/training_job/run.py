"""A run's training job: started once per execution, looked at until it ends, stopped on failure.

The job's name derives from the execution (and code and configuration: `training_job_name`), so
a retried StartTraining state finds the job its first attempt created, and the failure branch can
find a job even when the state that created it never returned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel

from functions.common.errors import (
    TrainerCodeMissingError,
    TrainingJobFailedError,
    TrainingJobOverdueError,
    TrainingJobStoppedError,
)
from functions.common.models import JobState, RunContext, RunState, TrainerCode
from functions.common.polling import cap_for, next_wait
from functions.common.requests import CheckTraining, StartTraining, StopTraining
from functions.common.trainer_code import verify_trainer_code
from functions.data.run_lock import execution_arn
from functions.training_job.builder import (
    TrainingRun,
    build_training_job_request,
    start_training_job,
    training_job_name,
)
from functions.training_job.config import JobConfig, load_job_config, parse_job_config
from functions.training_job.orphans import ENDED, stop_job

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient

    from functions.common.settings import TrainingJobSettings
    from functions.data.ledger import Ledger
    from functions.data.run_lock import Executions

log = logging.getLogger(__name__)

# After MaxRuntime (and a spot job's MaxWait) SageMaker stops the job itself; this much later we
# stop waiting for it to say so.
GRACE = timedelta(hours=1)
PENDING_RULES = frozenset({"InProgress", "Stopping"})


class StopOutcome(BaseModel):
    job_name: str | None  # None: no job had been created
    status: str | None = None  # the job's status before the stop
    stopped: bool = False


def job_limit_seconds(stopping: Any) -> int:
    """How long SageMaker lets the job run: MaxRuntime, or a spot job's MaxWait (which includes it)."""
    return int(max(stopping.get("MaxRuntimeInSeconds", 86400), stopping.get("MaxWaitTimeInSeconds", 0)))


def wait_timeout_seconds(stopping: Any) -> int:
    """The wait state's timeout: the job's limit, the overdue check's grace, and an hour more."""
    return job_limit_seconds(stopping) + int(GRACE.total_seconds()) + 3600


def job_config(settings: TrainingJobSettings) -> JobConfig:
    """The stack's job configuration (`TRAINING_JOB_*`), with the template's extra flags merged."""
    config = load_job_config()
    if not settings.training_extra_hyperparameters:
        return config
    merged = {**config.hyperparameters, **settings.training_extra_hyperparameters}
    return parse_job_config({**config.model_dump(), "hyperparameters": merged})


@dataclass(frozen=True)
class TrainingJobs:
    """This stack's training jobs: the configuration every job is built from, and where they run."""

    config: JobConfig
    sagemaker: SageMakerClient
    s3: S3Client
    bucket: str
    # Where each run's job name is kept (`Ledger.record_run_job`); None in tests of the job alone.
    ledger: Ledger | None = None
    # The runs' executions, asked whether a run ended while its job was created; None in tests of
    # the job alone.
    executions: Executions | None = None

    def handle(self, request: StartTraining | CheckTraining | StopTraining) -> JobState | StopOutcome:
        """What the state asks for: start the run's job, look at it, or stop it after a failure."""
        match request:
            case StartTraining():
                return self.start(request.run)
            case CheckTraining():
                return self.check(request.job, run=request.run)
            case StopTraining():
                return self.stop_if_started(request.state)

    def start(self, run: RunContext) -> JobState:
        job = self._recorded_job(run)
        if job is None:
            job = self._create(run)
        return self._stopped_if_run_ended(run, job)

    def _create(self, run: RunContext) -> JobState:
        config, training_run = self._job_for_run(run)
        request = build_training_job_request(config, training_run)
        # Last look before SageMaker runs the archive as the training role: the bytes the run
        # started with, or no job (a retry that found its job above has passed this already).
        verify_trainer_code(self.s3, _code_of(run), run=run.run or run.dataset_version)
        if self.ledger is not None and run.run:
            # Kept before the job exists: whatever ends this run finds the job by the run's name,
            # and a retry of this state finds it even if the code or the stack changed meanwhile.
            self.ledger.record_run_job(run.run, request["TrainingJobName"])
        started = start_training_job(request, sagemaker=self.sagemaker)
        return JobState(
            job_name=started.job_name,
            job_arn=started.job_arn,
            status="InProgress",
            wait_seconds=run.poll_seconds,
            created_at=datetime.now(UTC),
            already_existed=started.already_existed,
            wait_timeout_seconds=wait_timeout_seconds(request.get("StoppingCondition", {})),
        )

    def _stopped_if_run_ended(self, run: RunContext, job: JobState) -> JobState:
        """The job, stopped if this run's execution ended while the job was being created: whoever
        ended the run (RunEnded, a cancel) may have looked before the job existed."""
        if self.executions is None or not (run.execution_arn or run.run):
            return job
        arn = run.execution_arn or execution_arn(self.executions.state_machine_arn, run.run)
        # None (no such execution: a test calling this function directly) is left to the sweep.
        status = self.executions.status_at(arn)
        if status not in ENDED:
            return job
        stopped = job.status == "InProgress" and stop_job(self.sagemaker, job.job_name)
        log.warning(
            "run %s ended (%s) while its training job %s was being created: %s",
            run.run,
            status,
            job.job_name,
            "stopped it" if stopped else f"the job was {job.status} already",
        )
        return job.model_copy(update={"status": "Stopping" if stopped else job.status, "run_ended": status})

    def check(self, job: JobState, *, run: RunContext, now: datetime | None = None) -> JobState:
        """The job as it is now; raises when it failed, was stopped, or is overdue."""
        described: Any = self.sagemaker.describe_training_job(TrainingJobName=job.job_name)
        status = described["TrainingJobStatus"]
        secondary = described.get("SecondaryStatus")
        if status == "Failed":
            raise TrainingJobFailedError(
                f"training job {job.job_name} failed: {described.get('FailureReason') or 'no reason given'}"
            )
        if status == "Stopped":
            raise TrainingJobStoppedError(f"training job {job.job_name} was stopped ({secondary}) before it completed")
        stopping = described.get("StoppingCondition", {})
        limit = job_limit_seconds(stopping)
        created = described.get("CreationTime") or job.created_at or datetime.now(UTC)
        deadline = created + timedelta(seconds=limit) + GRACE
        moment = now or datetime.now(UTC)
        if status in {"InProgress", "Stopping"} and moment > deadline:
            if status == "InProgress":
                self.sagemaker.stop_training_job(TrainingJobName=job.job_name)
            raise TrainingJobOverdueError(
                f"training job {job.job_name} was still {status} ({secondary}) at {moment:%Y-%m-%d %H:%M} "
                f"UTC, {GRACE} past its limit of {limit} s: stopped"
            )
        pending = sorted(
            rule["RuleConfigurationName"]
            for rule in described.get("ProfilerRuleEvaluationStatuses", [])
            if rule.get("RuleEvaluationStatus") in PENDING_RULES
        )
        phase: Literal["training", "rules", "done"] = (
            "training" if status != "Completed" else ("rules" if pending else "done")
        )
        looked = job.checks + 1
        return job.model_copy(
            update={
                "status": status,
                "secondary_status": secondary,
                "phase": phase,
                "rules_pending": pending,
                "checks": looked,
                "wait_seconds": next_wait(run.poll_seconds, looked, cap_for(limit, floor=run.poll_max_seconds)),
                "created_at": created,
                "deadline": deadline,
                "wait_timeout_seconds": wait_timeout_seconds(stopping),
            }
        )

    def _recorded_job(self, run: RunContext) -> JobState | None:
        """The job an earlier attempt of this run created, computed once: its name is in the
        ledger, so a stack update between two attempts (which changes the name
        `training_job_name` would compute) cannot start a second job."""
        name = self.ledger.run_job(run.run) if self.ledger is not None and run.run else None
        if name is None:
            return None
        try:
            described: Any = self.sagemaker.describe_training_job(TrainingJobName=name)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ValidationException":
                return None  # recorded, then the create failed: this attempt creates it
            raise
        return JobState(
            job_name=name,
            job_arn=described["TrainingJobArn"],
            status=described["TrainingJobStatus"],
            wait_seconds=run.poll_seconds,
            created_at=described.get("CreationTime"),
            already_existed=True,
            wait_timeout_seconds=wait_timeout_seconds(described.get("StoppingCondition", {})),
        )

    def stop_if_started(self, state: RunState) -> StopOutcome:
        """Stop this execution's job if it exists and still runs (the failure branch's first step)."""
        recorded = self.ledger.run_job(state.run.run) if self.ledger is not None and state.run is not None else None
        if state.job is not None:
            name = state.job.job_name
        elif recorded is not None:
            name = recorded
        elif state.run is not None:
            try:
                name = training_job_name(*self._job_for_run(state.run))
            except TrainerCodeMissingError:
                return StopOutcome(job_name=None)  # without code no job can have been created
        else:
            return StopOutcome(job_name=None)
        try:
            status = self.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ValidationException":
                return StopOutcome(job_name=None)  # "Requested resource not found": never created
            raise
        if status != "InProgress":
            return StopOutcome(job_name=name, status=status)
        self.sagemaker.stop_training_job(TrainingJobName=name)
        return StopOutcome(job_name=name, status=status, stopped=True)

    def _job_for_run(self, run: RunContext) -> tuple[JobConfig, TrainingRun]:
        """The configuration and run this execution's job is built from (warm start included)."""
        code = _code_of(run)
        config = self.config
        if run.accepted is not None:
            # Start from the accepted model and score it on this version's validation split.
            config = self.config.model_copy(update={"model_s3_uri": run.accepted.weights_prefix_uri})
        training_run = TrainingRun(
            dataset_version=run.dataset_version,
            execution=run.run,
            code_sha256=code.sha256,
            code_s3_uri=code.uri,
        )
        return config, training_run


def _code_of(run: RunContext) -> TrainerCode:
    if run.code is None:
        raise TrainerCodeMissingError(
            f"run {run.run} carries no released trainer (it was started before runs fixed their code): "
            f"start it again (`retrain runs rerun {run.run}`)"
        )
    return run.code
