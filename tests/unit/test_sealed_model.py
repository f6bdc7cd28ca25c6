"""The evidence behind an approval cannot change afterwards (issue 28): an accepted model is
registered from a sealed copy of the very archive the gate judged, whose SHA-256 the package
records, and which no later job can overwrite; the package's metrics are pinned by their digest
and written once, so a retry after a job overwrote the archive fails rather than re-judge.

On moto's versioned S3 (which honours If-None-Match and reads by VersionId); SageMaker is a
stubbed client whose CreateModelPackage request is kept for the test to read. That only the
evaluation may write `models/packages/` and `reports/runs/` is the bucket policy's part
(tests/unit/test_permissions.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from functions.common.errors import EvidenceConflictError
from functions.evaluate_run.artifacts import seal
from functions.evaluate_run.logic import MODEL_SHA256_TAG, Evaluator
from tests.unit.fakes import stubbed, tar_gz, versioned_bucket
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
)
from tests.unit.test_evaluator import _metrics as metrics_of

RUN = FIRST_RUN.run
SEALED_KEY = f"models/packages/{RUN}/model.tar.gz"
JUDGED = tar_gz({"model.pt": WEIGHTS, "metrics.json": metrics_of(0.61)})
# What a later job (or anything the training role runs) writes over the same key.
LATER = tar_gz({"model.pt": b"another job's weights", "metrics.json": metrics_of(0.99)})
PACKAGE_ARN = f"arn:aws:sagemaker:eu-west-1:123456789012:model-package/{GROUP}/1"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3() -> Iterator[Any]:
    with versioned_bucket(BUCKET) as client:
        client.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=JUDGED)
        yield client


def read(s3: Any, uri: str) -> bytes:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


@contextmanager
def registering(s3: Any) -> Iterator[tuple[Evaluator, dict[str, Any]]]:
    """An evaluation that registers what it accepts; the CreateModelPackage request lands in the dict."""
    request: dict[str, Any] = {}
    with stubbed("sagemaker") as (sagemaker, stub):
        sagemaker.meta.events.register(
            "provide-client-params.sagemaker.CreateModelPackage", lambda params, **_: request.update(params)
        )
        stub.add_response("describe_training_job", DESCRIBED, {"TrainingJobName": JOB_NAME})
        stub.add_response("list_model_packages", {"ModelPackageSummaryList": []})
        stub.add_response("create_model_package", {"ModelPackageArn": PACKAGE_ARN})
        yield Evaluator(s3, sagemaker, BUCKET, POLICY, GROUP), request


class OverwrittenAfterReading:
    """The S3 client of an evaluation during which a later job overwrites the judged archive's key,
    right after the evaluation has read it."""

    def __init__(self, s3: Any) -> None:
        self._s3 = s3
        self.overwritten = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)

    def get_object(self, **request: Any) -> Any:
        answer = self._s3.get_object(**request)
        if request["Key"] == MODEL_KEY and not self.overwritten:
            self.overwritten = True
            self._s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=LATER)
        return answer


def test_an_accepted_model_is_registered_from_its_sealed_copy_and_the_package_records_its_sha256(s3: Any) -> None:
    with registering(s3) as (evaluator, request):
        evaluation = evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert evaluation.outcome == "accepted"
    (container,) = request["InferenceSpecification"]["Containers"]
    assert container["ModelDataUrl"] == f"s3://{BUCKET}/{SEALED_KEY}", "registered from the sealed copy"
    assert read(s3, container["ModelDataUrl"]) == JUDGED
    assert request["CustomerMetadataProperties"][MODEL_SHA256_TAG] == sha256(JUDGED)
    metrics = request["ModelMetrics"]["ModelQuality"]["Statistics"]
    assert metrics["ContentDigest"] == f"sha256:{sha256(read(s3, metrics['S3Uri']))}"
    accepted = s3.get_object(Bucket=BUCKET, Key="models/accepted.json")["Body"].read()
    assert sha256(JUDGED) in accepted.decode() and SEALED_KEY in accepted.decode()


def test_a_later_job_that_overwrites_the_training_output_does_not_change_the_registered_artifact(s3: Any) -> None:
    with registering(s3) as (evaluator, request):
        evaluator.evaluate(FIRST_RUN, JOB, now=NOW)
    s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=LATER)

    (container,) = request["InferenceSpecification"]["Containers"]
    registered = read(s3, container["ModelDataUrl"])
    assert sha256(registered) == request["CustomerMetadataProperties"][MODEL_SHA256_TAG] == sha256(JUDGED)


def test_the_archive_sealed_is_the_version_judged_even_if_a_job_overwrote_it_meanwhile(s3: Any) -> None:
    racing = OverwrittenAfterReading(s3)

    with registering(racing) as (evaluator, request):
        evaluation = evaluator.evaluate(FIRST_RUN, JOB, now=NOW)

    assert racing.overwritten and evaluation.miou == 0.61, "judged on what the job wrote first"
    (container,) = request["InferenceSpecification"]["Containers"]
    assert read(s3, container["ModelDataUrl"]) == JUDGED
    assert request["CustomerMetadataProperties"][MODEL_SHA256_TAG] == sha256(JUDGED)


def test_a_retry_finds_its_own_sealed_copy_and_goes_on(s3: Any) -> None:
    version = s3.head_object(Bucket=BUCKET, Key=MODEL_KEY)["VersionId"]

    first = seal(s3, f"s3://{BUCKET}/{MODEL_KEY}", version, BUCKET, SEALED_KEY)
    again = seal(s3, f"s3://{BUCKET}/{MODEL_KEY}", version, BUCKET, SEALED_KEY)

    assert again == first and first.sha256 == sha256(JUDGED)
    assert len(s3.list_object_versions(Bucket=BUCKET, Prefix=SEALED_KEY)["Versions"]) == 1, "written once"


def test_other_bytes_are_never_sealed_over_a_sealed_model(s3: Any) -> None:
    version = s3.head_object(Bucket=BUCKET, Key=MODEL_KEY)["VersionId"]
    seal(s3, f"s3://{BUCKET}/{MODEL_KEY}", version, BUCKET, SEALED_KEY)
    later = s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=LATER)["VersionId"]

    with pytest.raises(EvidenceConflictError, match="never replaced"):
        seal(s3, f"s3://{BUCKET}/{MODEL_KEY}", later, BUCKET, SEALED_KEY)

    assert read(s3, f"s3://{BUCKET}/{SEALED_KEY}") == JUDGED


def test_a_retry_after_a_job_overwrote_the_archive_fails_and_leaves_the_evidence_as_judged(s3: Any) -> None:
    with registering(s3) as (evaluator, request):
        evaluator.evaluate(FIRST_RUN, JOB, now=NOW)
    s3.put_object(Bucket=BUCKET, Key=MODEL_KEY, Body=LATER)  # then the state is retried

    with stubbed("sagemaker") as (sagemaker, stub):
        stub.add_response("describe_training_job", DESCRIBED, {"TrainingJobName": JOB_NAME})
        retry = Evaluator(s3, sagemaker, BUCKET, POLICY, GROUP)
        with pytest.raises(EvidenceConflictError, match="never replaced"):
            retry.evaluate(FIRST_RUN, JOB, now=NOW)

    metrics = request["ModelMetrics"]["ModelQuality"]["Statistics"]
    assert metrics["ContentDigest"] == f"sha256:{sha256(read(s3, metrics['S3Uri']))}", "the metrics judged"
    assert read(s3, f"s3://{BUCKET}/{SEALED_KEY}") == JUDGED
