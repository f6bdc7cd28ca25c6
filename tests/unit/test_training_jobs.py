"""The training job of an engineer's run, as the state machine asks for it: started once, with the
trainer the run started with and no other, looked at, and stopped when the run fails; and a
request that lacks what its action needs, refused.

No AWS: SageMaker and S3 are stubbed clients that answer exactly the calls each action must make
(and fail the test on any other).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from botocore.stub import ANY, Stubber

from functions.common.errors import InvalidEventError, TrainerCodeMismatchError, TrainerCodeMissingError
from functions.common.models import JobState, RunContext, RunState
from functions.common.requests import CheckTraining, StartTraining, StopTraining, parse_training_request
from functions.training_job.run import StopOutcome, TrainingJobs
from tests.conftest import load_event
from tests.unit.fakes import body, stubbed
from tests.unit.training_job.helpers import BUCKET, job_config, load_sagemaker_event

RUN_EVENT = load_event("run_context.json")
RUN = RunContext.model_validate(RUN_EVENT)
# The archive whose sha256 the run was started with (run_context.json's code).
RELEASED = b"the released trainer: sourcedir.tar.gz"
DESCRIBED = {
    k: v
    for k, v in load_sagemaker_event("describe_completed_no_profiler_rules.json").items()
    if k != "ResponseMetadata"
}
JOB = JobState(
    job_name=DESCRIBED["TrainingJobName"], job_arn=DESCRIBED["TrainingJobArn"], status="InProgress", wait_seconds=0
)


@contextmanager
def _jobs() -> Iterator[tuple[TrainingJobs, Stubber, Stubber]]:
    with stubbed("sagemaker") as (sagemaker, sagemaker_stub), stubbed("s3") as (s3, s3_stub):
        yield TrainingJobs(job_config(), sagemaker, s3, BUCKET), sagemaker_stub, s3_stub


def _described(status: str) -> dict[str, Any]:
    """DescribeTrainingJob's answer (its times as boto3 returns them: datetimes)."""
    return {
        **DESCRIBED,
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training" if status == "InProgress" else status,
        "CreationTime": datetime.fromisoformat(DESCRIBED["CreationTime"]),
    }


def _the_runs_trainer_reads(s3: Stubber, archive: bytes) -> None:
    """GetObject of the run's code answers these bytes."""
    assert RUN.code is not None
    bucket, _, key = RUN.code.uri.removeprefix("s3://").partition("/")
    s3.add_response("get_object", {"Body": body(archive)}, {"Bucket": bucket, "Key": key})


def test_a_start_creates_the_runs_job_from_the_stacks_configuration() -> None:
    with _jobs() as (jobs, sagemaker, s3):
        _the_runs_trainer_reads(s3, RELEASED)
        sagemaker.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:::training-job/x"}, None)

        job = jobs.handle(StartTraining(action="start", run=RUN))

    assert isinstance(job, JobState)
    assert job.job_name.startswith(f"retrain-{RUN.dataset_version}-")
    assert (job.status, job.already_existed) == ("InProgress", False)
    # The wait state's TimeoutSecondsPath: past the safety poll's overdue check (limit + 1 h).
    assert job.wait_timeout_seconds == jobs.config.max_runtime_seconds + 2 * 3600


def test_a_trainer_replaced_after_the_run_started_is_refused_before_any_job_is_created() -> None:
    replaced = b"someone else's train.py, packed under the same key"
    with _jobs() as (jobs, _, s3):  # SageMaker answers nothing: a CreateTrainingJob fails the test
        _the_runs_trainer_reads(s3, replaced)

        with pytest.raises(TrainerCodeMismatchError) as refused:
            jobs.handle(StartTraining(action="start", run=RUN))

    assert RUN.code is not None
    message = str(refused.value)
    assert f"{RUN.code.uri} has sha256 {hashlib.sha256(replaced).hexdigest()}" in message, message
    assert f"run {RUN.run} was started with {RUN.code.sha256}" in message, message
    assert "release the trainer again" in message and f"retrain runs rerun {RUN.run}" in message, message


def test_a_trainer_deleted_after_the_run_started_is_refused_by_name() -> None:
    assert RUN.code is not None
    with _jobs() as (jobs, _, s3):
        s3.add_client_error("get_object", "NoSuchKey", http_status_code=404)

        with pytest.raises(TrainerCodeMissingError, match=f"{RUN.code.uri}, is gone: nothing was trained"):
            jobs.handle(StartTraining(action="start", run=RUN))


def test_a_run_that_carries_no_released_trainer_is_refused_and_reads_nothing() -> None:
    with _jobs() as (jobs, _, _), pytest.raises(TrainerCodeMissingError, match="carries no released trainer"):
        jobs.handle(StartTraining(action="start", run=RUN.model_copy(update={"code": None})))


def test_a_look_at_a_job_that_completed_says_it_is_done() -> None:
    with _jobs() as (jobs, sagemaker, _):
        sagemaker.add_response("describe_training_job", _described("Completed"), {"TrainingJobName": JOB.job_name})

        looked = jobs.handle(CheckTraining(action="check", run=RUN, job=JOB))

    assert isinstance(looked, JobState)
    assert (looked.status, looked.phase, looked.checks) == ("Completed", "done", 1)


def test_the_failure_branch_stops_the_job_that_still_runs() -> None:
    state = RunState(run=RUN, job=JOB)
    with _jobs() as (jobs, sagemaker, _):
        sagemaker.add_response("describe_training_job", _described("InProgress"), {"TrainingJobName": JOB.job_name})
        sagemaker.add_response("stop_training_job", {}, {"TrainingJobName": JOB.job_name})

        outcome = jobs.handle(StopTraining(action="stop", state=state))

    assert outcome == StopOutcome(job_name=JOB.job_name, status="InProgress", stopped=True)


def test_the_failure_branch_finds_the_job_by_its_name_when_the_state_never_saw_it() -> None:
    with _jobs() as (jobs, sagemaker, _):
        sagemaker.add_response("describe_training_job", _described("Completed"), {"TrainingJobName": ANY})

        outcome = jobs.handle(StopTraining(action="stop", state=RunState(run=RUN)))

    assert isinstance(outcome, StopOutcome)
    assert outcome.job_name is not None and outcome.job_name.startswith(f"retrain-{RUN.dataset_version}-")
    assert (outcome.status, outcome.stopped) == ("Completed", False), "a job that ended is left alone"


def test_a_failure_before_any_run_context_has_nothing_to_stop_and_asks_nothing() -> None:
    with _jobs() as (jobs, _, _):
        outcome = jobs.handle(StopTraining(action="stop", state=RunState(dataset_version="v1")))

    assert outcome == StopOutcome(job_name=None)


@pytest.mark.parametrize(
    ("event", "request_type"),
    [
        ({"action": "start", "run": RUN_EVENT}, StartTraining),
        ({"action": "check", "run": RUN_EVENT, "job": JOB.model_dump(mode="json")}, CheckTraining),
        ({"action": "stop", "state": {"run": RUN_EVENT}}, StopTraining),
    ],
)
def test_each_action_is_read_as_its_own_request(event: dict[str, Any], request_type: type) -> None:
    assert isinstance(parse_training_request(event), request_type)


@pytest.mark.parametrize(
    ("event", "says"),
    [
        (
            {"action": "check", "run": RUN_EVENT},
            r"check lacks what it needs: \['action', 'run'\] \(check.job: Field required\)",
        ),
        ({"action": "start"}, "start lacks what it needs"),
        ({"action": "stop"}, "stop lacks what it needs"),
        ({"action": "train", "run": RUN_EVENT}, "train lacks what it needs"),
    ],
)
def test_a_request_that_lacks_what_its_action_needs_is_refused_by_name(event: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidEventError, match=says):
        parse_training_request(event)
