"""A run waits for its training job by the job's events, with a safety poll (functions/training_job/
waiting.py): the wait's task token is kept, answered once when the job ends, and forgotten.

SageMaker and Step Functions are stubbed clients that answer exactly the calls each step must make
(and fail the test on any other); the ledger is emulated (moto).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from functions.common.models import JobState, RunContext
from functions.common.requests import JobStateChange, parse_training_request
from functions.data.ledger import Ledger
from functions.training_job.run import TrainingJobs
from functions.training_job.waiting import JobWaits
from retrain.local.cloudformation.stack import create_ledger_table
from tests.conftest import load_event
from tests.unit.fakes import stubbed
from tests.unit.training_job.helpers import BUCKET, job_config, load_sagemaker_event

RUN = RunContext.model_validate(load_event("run_context.json"))
DESCRIBED = {
    k: v
    for k, v in load_sagemaker_event("describe_completed_no_profiler_rules.json").items()
    if k != "ResponseMetadata"
}
NAME = DESCRIBED["TrainingJobName"]
JOB = JobState(job_name=NAME, job_arn=DESCRIBED["TrainingJobArn"], status="InProgress", wait_seconds=0)
TOKEN = "AQB8AAAAKgAAAAMAAAAAAAAAAT0k" * 4


@dataclass
class Waits:
    waits: JobWaits
    ledger: Ledger
    sagemaker: Stubber
    sfn: Stubber


@contextmanager
def _waits() -> Iterator[Waits]:
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        ledger = Ledger(dynamodb, "ledger")
        with (
            stubbed("sagemaker") as (sagemaker, sagemaker_stub),
            stubbed("s3") as (s3, _),
            stubbed("stepfunctions") as (sfn, sfn_stub),
        ):
            jobs = TrainingJobs(job_config(), sagemaker, s3, BUCKET, ledger)
            yield Waits(JobWaits(jobs, ledger, sfn), ledger, sagemaker_stub, sfn_stub)


def _described(status: str, **extra: Any) -> dict[str, Any]:
    return {
        **DESCRIBED,
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training" if status == "InProgress" else status,
        "CreationTime": datetime.now(UTC),  # well within its MaxRuntime
        **extra,
    }


def _looked_at(waits: Waits, status: str, **extra: Any) -> None:
    waits.sagemaker.add_response("describe_training_job", _described(status, **extra), {"TrainingJobName": NAME})


def test_a_job_still_running_is_waited_for_without_any_answer() -> None:
    with _waits() as w:
        _looked_at(w, "InProgress")

        report = w.waits.await_job(RUN, JOB, TOKEN)

        assert report.outcome == "waiting"
        kept = w.ledger.waiting_job(NAME)
        assert kept is not None and (kept.token, kept.execution) == (TOKEN, RUN.run)


def test_a_job_that_ended_before_its_wait_began_is_answered_at_once() -> None:
    with _waits() as w:
        _looked_at(w, "Completed")
        w.sfn.add_response("send_task_success", {}, None)

        report = w.waits.await_job(RUN, JOB, TOKEN)

        assert report.outcome == "succeeded"
        assert w.ledger.waiting_job(NAME) is None, "forgotten once answered"


def test_the_jobs_end_event_sends_its_state_back_and_a_redelivery_sends_nothing() -> None:
    with _waits() as w:
        _looked_at(w, "InProgress")
        w.waits.await_job(RUN, JOB, TOKEN)
        _looked_at(w, "Completed")
        sent: list[dict[str, Any]] = []
        w.sfn.add_response("send_task_success", {}, None)
        w.sfn.client.meta.events.register(
            "provide-client-params.*.SendTaskSuccess", lambda params, **_: sent.append(params)
        )
        event = {
            "version": "0",
            "id": "3f0c1ab2-8f4c-4b1e-9a55-0c7c2d1e9a10",
            "detail-type": "SageMaker Training Job State Change",
            "source": "aws.sagemaker",
            "account": "123456789012",
            "time": "2026-12-05T10:00:00Z",
            "region": "us-east-1",
            "resources": [JOB.job_arn],
            "detail": {"TrainingJobName": NAME, "TrainingJobStatus": "Completed"},
        }
        request = parse_training_request(event)
        assert isinstance(request, JobStateChange)

        first = w.waits.handle(request)
        again = w.waits.handle(request)

        assert [s.outcome for s in first.settled] == ["succeeded"]
        (params,) = sent
        assert params["taskToken"] == TOKEN
        assert JobState.model_validate(json.loads(params["output"])).phase == "done"
        assert again.ignored and again.settled == [], "the wait was answered: nothing is sent twice"


def test_a_failed_job_fails_the_wait_with_the_trainers_reason() -> None:
    with _waits() as w:
        _looked_at(w, "InProgress")
        w.waits.await_job(RUN, JOB, TOKEN)
        _looked_at(w, "Failed", FailureReason="AlgorithmError: CUDA out of memory")
        w.sfn.add_response(
            "send_task_failure",
            {},
            {
                "taskToken": TOKEN,
                "error": "TrainingJobFailedError",
                "cause": f"training job {NAME} failed: AlgorithmError: CUDA out of memory",
            },
        )

        settled = w.waits.on_event(NAME, "Failed")

        assert settled is not None and (settled.outcome, settled.error) == ("failed", "TrainingJobFailedError")
        assert w.ledger.waiting_job(NAME) is None


def test_the_safety_poll_keeps_a_running_wait_alive_and_answers_a_job_whose_event_was_lost() -> None:
    with _waits() as w:
        _looked_at(w, "InProgress")
        w.waits.await_job(RUN, JOB, TOKEN)
        _looked_at(w, "InProgress")
        w.sfn.add_response("send_task_heartbeat", {}, {"taskToken": TOKEN})

        (alive,) = w.waits.sweep()

        assert alive.outcome == "heartbeat"
        _looked_at(w, "Completed")  # ... and its Completed event never came
        w.sfn.add_response("send_task_success", {}, None)
        (ended,) = w.waits.sweep()
        assert ended.outcome == "succeeded"
        assert w.waits.sweep() == []


@pytest.mark.parametrize("code", ["TaskTimedOut", "TaskDoesNotExist", "InvalidToken"])
def test_a_wait_whose_run_ended_meanwhile_is_forgotten(code: str) -> None:
    with _waits() as w:
        _looked_at(w, "InProgress")
        w.waits.await_job(RUN, JOB, TOKEN)
        _looked_at(w, "InProgress")
        w.sfn.add_client_error("send_task_heartbeat", service_error_code=code, http_status_code=400)

        (gone,) = w.waits.sweep()

        assert gone.outcome == "gone"
        assert w.ledger.waiting_job(NAME) is None


def test_an_event_of_a_job_no_run_waits_for_is_ignored() -> None:
    with _waits() as w:
        assert w.waits.on_event("retrain-other-stack-job", "Completed") is None
