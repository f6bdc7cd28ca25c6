"""Two evaluations can never both believe they set `models/accepted.json` (issue 27): it is
written conditionally (If-Match on the ETag read just before, If-None-Match for the first model),
only while it still names the model the run was compared with. The loser says which run was
accepted instead, and its model stays registered but not accepted.

On moto's S3, which honours PutObject's If-Match and If-None-Match with 412 PreconditionFailed;
SageMaker is a stubbed client per evaluation (DescribeTrainingJob, the registry's calls).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import ANY
from moto import mock_aws

from functions.common import prefixes
from functions.common.models import AcceptedModel, RunContext
from functions.common.summary import RunSummary
from functions.evaluate_run import history
from functions.evaluate_run.logic import Evaluation, Evaluator
from functions.evaluate_run.trust import TrustChanges
from functions.notify.render import SUBJECT_LIMIT, render
from tests.unit.fakes import stubbed, tar_gz
from tests.unit.notify_cases import links_for
from tests.unit.test_evaluator import (
    BUCKET,
    DESCRIBED,
    FIRST_RUN,
    GROUP,
    JOB,
    JOB_NAME,
    MODEL_KEY,
    NOW,
    POLICY,
    WEIGHTS,
    _after_an_accepted_run,
    _metrics,
)

RUNS = ("ds-20261203-091500-aaaaaaaa", "ds-20261203-091501-bbbbbbbb")


def package(run: str) -> str:
    return f"arn:aws:sagemaker:eu-west-1:123456789012:model-package/{GROUP}/{RUNS.index(run) + 1}"


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


class TrustSeen:
    """Stands in for the pairs' trust keeper: which runs' screenings it was asked to record."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def record(self, run: str, screening: Any, *, pictures: Any, now: Any) -> TrustChanges:
        self.runs.append(run)
        return TrustChanges()


@contextmanager
def evaluator(s3: Any, run: str, trust: TrustSeen | None = None) -> Iterator[Evaluator]:
    """An evaluation of `run`'s finished job that registers its model, as the stack's does."""
    with stubbed("sagemaker") as (sagemaker, stub):
        stub.add_response("describe_training_job", DESCRIBED, {"TrainingJobName": JOB_NAME})
        stub.add_response("list_model_packages", {"ModelPackageSummaryList": []})
        stub.add_response("create_model_package", {"ModelPackageArn": package(run)}, dict.fromkeys(CREATE, ANY))
        yield Evaluator(s3, sagemaker, BUCKET, POLICY, GROUP, trust)  # type: ignore[arg-type]


CREATE = (
    "ModelPackageGroupName",
    "ModelPackageDescription",
    "ModelApprovalStatus",
    "InferenceSpecification",
    "CustomerMetadataProperties",
    "ModelMetrics",
)


class ReadsThenWaits:
    """The S3 client of one evaluation: after its first read of `models/accepted.json` it waits
    until the other evaluation has read it too, so both believe they may write it. S3 decides
    conditional writes to one key one at a time; moto checks the condition and stores the object
    in two steps that two threads could interleave, so the writes are let through one at a time."""

    def __init__(self, s3: Any, barrier: threading.Barrier, one_write_at_a_time: threading.Lock) -> None:
        self._s3, self._barrier, self._writes = s3, barrier, one_write_at_a_time
        self._waited = False
        self.writes: list[str] = []  # how each write of accepted.json went: "written", or S3's error code

    def get_object(self, **request: Any) -> Any:
        try:
            return self._s3.get_object(**request)
        finally:
            if request["Key"] == prefixes.ACCEPTED_MODEL and not self._waited:
                self._waited = True
                self._barrier.wait(timeout=30)

    def put_object(self, **request: Any) -> Any:
        if request["Key"] != prefixes.ACCEPTED_MODEL:
            return self._s3.put_object(**request)
        condition = "IfMatch" if "IfMatch" in request else "IfNoneMatch" if "IfNoneMatch" in request else None
        assert condition is not None, "accepted.json is only ever written conditionally"
        with self._writes:
            try:
                written = self._s3.put_object(**request)
            except ClientError as error:
                self.writes.append(error.response["Error"]["Code"])
                raise
        self.writes.append("written")
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)


def run_of(context: RunContext, run: str) -> RunContext:
    return context.model_copy(update={"run": run})


@pytest.mark.parametrize("before", ["the first model", "an accepted model"])
def test_two_evaluations_racing_for_accepted_json_one_wins_and_the_other_knows(s3: Any, before: str) -> None:
    if before == "the first model":
        context, baseline = FIRST_RUN, None
    else:
        context = _after_an_accepted_run(0.70)
        assert context.accepted is not None
        baseline = context.accepted.model_dump_json()
        s3.put_object(Bucket=BUCKET, Key=prefixes.ACCEPTED_MODEL, Body=baseline.encode())
    s3.put_object(
        Bucket=BUCKET, Key=MODEL_KEY, Body=tar_gz({"model.pt": WEIGHTS, "metrics.json": _metrics(0.72, baseline=0.70)})
    )
    barrier, one_at_a_time = threading.Barrier(len(RUNS)), threading.Lock()
    clients = {run: ReadsThenWaits(s3, barrier, one_at_a_time) for run in RUNS}

    def evaluate(run: str) -> Evaluation:
        with evaluator(clients[run], run) as evaluation:
            return evaluation.evaluate(run_of(context, run), JOB, now=NOW)

    with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
        outcomes = dict(zip(RUNS, pool.map(evaluate, RUNS), strict=True))

    assert sorted(o.outcome for o in outcomes.values()) == ["accepted", "rejected"], "exactly one wins"
    (winner,) = [run for run, o in outcomes.items() if o.outcome == "accepted"]
    (loser,) = [run for run in RUNS if run != winner]
    accepted = AcceptedModel.model_validate_json(
        s3.get_object(Bucket=BUCKET, Key=prefixes.ACCEPTED_MODEL)["Body"].read()
    )
    assert (accepted.run, accepted.model_package_arn) == (winner, package(winner))
    assert clients[winner].writes == ["written"]
    assert clients[loser].writes == ["PreconditionFailed"], "both tried; S3's condition refused the second"
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"reports/runs/{loser}/summary.json")["Body"].read())
    compared = "no model (the first run)" if baseline is None else "run ds-20261120-080000-0badc0de's model"
    assert summary["outcome"] == "rejected" and summary["gate"]["accepted"] is False
    assert summary["gate"]["reasons"][0] == (
        f"run {winner} was accepted meanwhile: models/accepted.json names it, while this model was compared "
        f"with {compared}: it stays registered ({package(loser)}) but is not accepted"
    )
    assert summary["model_package_arn"] == package(loser), "registered for review, not accepted"
    assert outcomes[loser].model_package_arn == package(loser)
    won = json.loads(s3.get_object(Bucket=BUCKET, Key=f"reports/runs/{winner}/summary.json")["Body"].read())
    assert won["outcome"] == "accepted" and won["gate"]["accepted"] is True
    told = render(RunSummary.model_validate(summary), links_for(RunSummary.model_validate(summary)))
    assert summary["gate"]["accepted_meanwhile"] == winner
    # Not "rejected by the quality gate": the gate passed it; another run was accepted first.
    # The gate's mIoU and change, and the pairs both models were scored on (no pair is trusted
    # yet: the split); the dataset version gives way to them in SNS's 100 characters.
    assert told.subject.startswith(
        "Retraining passed the gate, another run won: mIoU 0.720 (+0.020, validation split)"
    ), told.subject
    assert len(told.subject) <= SUBJECT_LIMIT, f"SNS refuses a subject of {len(told.subject)} characters"

    assert f"Quality gate: passed, not accepted\n  - run {winner} was accepted meanwhile" in told.text
    assert told.slack["blocks"][0]["text"]["text"].endswith("Retraining passed the gate, another run won")
    # The history page as the next evaluation writes it (the two racing rewrites may each have
    # listed the summaries before the other's was written: the next evaluation's lists both).
    page = history.render([RunSummary.model_validate(summary), RunSummary.model_validate(won)])
    assert f"gate passed; accepted meanwhile: {winner}" in page, "the history page says why it was not accepted"


def test_a_run_whose_baseline_was_replaced_before_it_was_evaluated_is_not_accepted(s3: Any) -> None:
    context = _after_an_accepted_run(0.70)
    assert context.accepted is not None
    replaced = context.accepted.model_copy(update={"run": "ds-20261202-080000-5ca1ab1e"})  # another run's, since
    s3.put_object(Bucket=BUCKET, Key=prefixes.ACCEPTED_MODEL, Body=replaced.model_dump_json().encode())
    s3.put_object(
        Bucket=BUCKET, Key=MODEL_KEY, Body=tar_gz({"model.pt": WEIGHTS, "metrics.json": _metrics(0.72, baseline=0.70)})
    )

    trust = TrustSeen()

    with evaluator(s3, RUNS[0], trust) as evaluation:
        outcome = evaluation.evaluate(run_of(context, RUNS[0]), JOB, now=NOW)

    assert outcome.outcome == "rejected"
    # Trust comes from the screening's judgement (by the model accepted when the run started),
    # not from the gate's verdict on the candidate: it is recorded once, whatever the outcome.
    assert trust.runs == [RUNS[0]]
    named = json.loads(s3.get_object(Bucket=BUCKET, Key=prefixes.ACCEPTED_MODEL)["Body"].read())["run"]
    assert named == "ds-20261202-080000-5ca1ab1e", "the newer model stays accepted"


def test_a_retry_after_its_own_write_is_still_the_accepted_run(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=tar_gz({"model.pt": WEIGHTS, "metrics.json": _metrics(0.61)}))
    run = run_of(FIRST_RUN, RUNS[0])
    outcomes = []
    for _ in ("the first attempt", "its retry"):
        with stubbed("sagemaker") as (sagemaker, stub):
            stub.add_response("describe_training_job", DESCRIBED, {"TrainingJobName": JOB_NAME})
            outcomes.append(Evaluator(s3, sagemaker, BUCKET, POLICY).evaluate(run, JOB, now=NOW).outcome)

    assert outcomes == ["accepted", "accepted"]
    named = json.loads(s3.get_object(Bucket=BUCKET, Key=prefixes.ACCEPTED_MODEL)["Body"].read())["run"]
    assert named == RUNS[0]
