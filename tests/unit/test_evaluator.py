"""An engineer's finished job, evaluated: what is published, which model the gate lets through,
and what a job that left no usable artifacts does to the run.

No AWS: the job's archives are in an in-memory bucket, and SageMaker is a stubbed client that
answers exactly the calls the evaluation must make (DescribeTrainingJob, and the model registry's
calls when a model is accepted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from botocore.stub import ANY, Stubber

from functions.common.errors import RunArtifactsMissingError
from functions.common.models import AcceptedModel, JobState, RunContext
from functions.evaluate_run.gate import GatePolicy
from functions.evaluate_run.logic import Evaluator
from tests.conftest import load_event
from tests.unit.fakes import FakeS3, stubbed, tar_gz
from tests.unit.test_quality_gate import metrics as gate_metrics
from tests.unit.training_job.helpers import load_sagemaker_event

DESCRIBED = {
    k: v
    for k, v in load_sagemaker_event("describe_completed_no_profiler_rules.json").items()
    if k != "ResponseMetadata"
}
BUCKET = "retrain-data-123456789012-eu-west-1"
JOB_NAME = DESCRIBED["TrainingJobName"]
MODEL_KEY = f"training/{JOB_NAME}/output/model.tar.gz"
JOB = JobState(job_name=JOB_NAME, job_arn=DESCRIBED["TrainingJobArn"], status="Completed", wait_seconds=0)
FIRST_RUN = RunContext.model_validate(load_event("run_context.json"))
RUN = FIRST_RUN.run
NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
POLICY = GatePolicy(miou_tolerance=0.01, class_tolerance=0.05)
WEIGHTS = b"the model's state dict"
GROUP = "retrain-models"
PACKAGE_ARN = f"arn:aws:sagemaker:eu-west-1:123456789012:model-package/{GROUP}/1"


def _metrics(miou: float, *, baseline: float | None = None, losses: tuple[float, ...] = (1.0, 0.5)) -> bytes:
    """The job's metrics.json (the quality-gate tests' builder), for this run's dataset version."""
    classes: dict[str, float | None] = {"road": miou, "car": miou}
    accepted = (
        {"model": "accepted", "miou": baseline, "per_class_iou": dict.fromkeys(classes, baseline)}
        if baseline is not None
        else None
    )
    document = gate_metrics(miou, classes, baseline=accepted, losses=losses)
    return document.model_copy(update={"dataset_version": FIRST_RUN.dataset_version}).model_dump_json().encode()


def _job_left(s3: FakeS3, members: dict[str, bytes] | None) -> None:
    """What the training job wrote: its model archive (None: none at all)."""
    if members is not None:
        s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=tar_gz(members))


def _after_an_accepted_run(miou: float) -> RunContext:
    accepted = AcceptedModel(
        run="ds-20261120-080000-0badc0de",
        job_name="retrain-earlier",
        dataset_version="ds-20261120-080000-0badc0de",
        model_uri=f"s3://{BUCKET}/training/retrain-earlier/output/model.tar.gz",
        weights_prefix_uri=f"s3://{BUCKET}/models/runs/ds-20261120-080000-0badc0de/",
        miou=miou,
        accepted_at=datetime(2026, 11, 20, tzinfo=UTC),
    )
    return FIRST_RUN.model_copy(update={"accepted": accepted})


@contextmanager
def _evaluator(s3: FakeS3, *, group: str = "") -> Iterator[tuple[Evaluator, Stubber]]:
    """An Evaluator whose SageMaker describes the completed job once; more is queued by the test."""
    with stubbed("sagemaker") as (sagemaker, stub):
        stub.add_response("describe_training_job", DESCRIBED, {"TrainingJobName": JOB_NAME})
        yield Evaluator(s3, sagemaker, BUCKET, POLICY, group), stub


def test_the_first_model_that_learned_is_accepted_its_reports_published_and_its_weights_kept() -> None:
    s3 = FakeS3()
    _job_left(s3, {"model.pt": WEIGHTS, "metrics.json": _metrics(0.61)})

    with _evaluator(s3) as (evaluator, _):
        evaluation = evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert (evaluation.outcome, evaluation.miou, evaluation.baseline_miou) == ("accepted", 0.61, None)
    assert evaluation.summary_uri == f"s3://{BUCKET}/reports/runs/{RUN}/summary.json"
    summary = s3.json(BUCKET, f"reports/runs/{RUN}/summary.json")
    assert summary["gate"]["accepted"] and "the first model" in summary["gate"]["reasons"][0]
    assert summary["artifacts"]["weights"] == f"s3://{BUCKET}/models/runs/{RUN}/model.pt"
    assert s3.read(BUCKET, f"models/runs/{RUN}/model.pt") == WEIGHTS, "the next run starts from these"
    accepted = s3.json(BUCKET, "models/accepted.json")
    assert (accepted["run"], accepted["model_uri"]) == (RUN, f"s3://{BUCKET}/models/packages/{RUN}/model.tar.gz")
    assert s3.json(BUCKET, f"reports/runs/{RUN}/metrics.json")["miou"] == 0.61


def test_a_model_worse_than_the_accepted_one_is_rejected_and_the_accepted_one_stays() -> None:
    s3 = FakeS3()
    s3.put_object(Bucket=BUCKET, Key="models/accepted.json", Body=b'{"run": "the earlier one"}')
    _job_left(s3, {"model.pt": WEIGHTS, "metrics.json": _metrics(0.60, baseline=0.70)})

    with _evaluator(s3) as (evaluator, _):
        evaluation = evaluator.evaluate(_after_an_accepted_run(0.70), JOB, now=NOW)

    assert (evaluation.outcome, evaluation.baseline_miou) == ("rejected", 0.70)
    summary = s3.json(BUCKET, f"reports/runs/{RUN}/summary.json")
    assert summary["outcome"] == "rejected"
    assert "from the accepted model's 0.700" in summary["gate"]["reasons"][0]
    assert s3.json(BUCKET, "models/accepted.json") == {"run": "the earlier one"}
    assert f"models/runs/{RUN}/model.pt" not in s3.keys(BUCKET), "a rejected model's weights are not kept"


def test_a_first_model_that_learned_nothing_is_rejected() -> None:
    s3 = FakeS3()
    _job_left(s3, {"model.pt": WEIGHTS, "metrics.json": _metrics(0.2, losses=(1.0, 1.3))})

    with _evaluator(s3) as (evaluator, _):
        evaluation = evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert evaluation.outcome == "rejected"
    assert "models/accepted.json" not in s3.keys(BUCKET)


def test_an_accepted_model_is_registered_for_review_once() -> None:
    s3 = FakeS3()
    _job_left(s3, {"model.pt": WEIGHTS, "metrics.json": _metrics(0.61)})

    with _evaluator(s3, group=GROUP) as (evaluator, stub):
        stub.add_response("list_model_packages", {"ModelPackageSummaryList": []})
        stub.add_response(
            "create_model_package",
            {"ModelPackageArn": PACKAGE_ARN},
            {
                "ModelPackageGroupName": GROUP,
                "ModelPackageDescription": ANY,
                "ModelApprovalStatus": "PendingManualApproval",
                "InferenceSpecification": ANY,
                "CustomerMetadataProperties": ANY,
                "ModelMetrics": ANY,
            },
        )
        evaluation = evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert evaluation.model_package_arn == PACKAGE_ARN
    assert s3.json(BUCKET, "models/accepted.json")["model_package_arn"] == PACKAGE_ARN


@pytest.mark.parametrize(
    ("left", "says"),
    [
        pytest.param(None, "is not there", id="no model archive"),
        pytest.param({"metrics.json": _metrics(0.61)}, "holds no model.pt", id="no model in it"),
        pytest.param({"model.pt": WEIGHTS}, "holds metrics.json", id="no metrics"),
        pytest.param(
            {"model.pt": WEIGHTS, "metrics.json": b'{"miou": 2}'}, "not what the trainer writes", id="bad metrics"
        ),
    ],
)
def test_a_job_without_usable_artifacts_fails_the_run_and_nothing_is_accepted(
    left: dict[str, bytes] | None, says: str
) -> None:
    s3 = FakeS3()
    _job_left(s3, left)

    with _evaluator(s3) as (evaluator, _), pytest.raises(RunArtifactsMissingError, match=says):
        evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert [key for key in s3.keys(BUCKET) if key.startswith(("models/", "reports/"))] == []
