"""The code a run trains with is the code that was released (issue 28), on the offline stack.

Someone who may write to the data bucket replaces the released trainer's archive before an
annotation team's drop starts a run. On AWS the bucket policy already refuses that write to
everyone but the release role (tests/unit/test_permissions.py); offline moto leaves conditional
Deny statements out, so this is the run's own check: the run refuses, before any training job
exists, and the team is told why and what to do. Releasing the trainer again restores it, and
the next run trains.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.package import TRAINER_DIR, build_sourcedir, release_trainer
from tests.integration.conftest import DATA, TRAINING
from tests.integration.runs import drop_with_validation, history_states, job_names, read_json, run_to_end

pytestmark = pytest.mark.slow(seconds=40)  # two runs, one of them trained, on 2 cores


@pytest.fixture
def stack() -> Iterator[OfflineStack]:
    options = StackOptions(parameters={**DATA, **TRAINING}, poll=False, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as offline:
        yield offline


def replace_the_released_trainer(stack: OfflineStack, folder: Path) -> str:
    """What someone with broad S3 rights does: a trainer of their own (here, one more line in
    train.py), packed and written over every trainer archive the stack holds. Its sha256."""
    theirs = folder / "trainer"
    shutil.copytree(TRAINER_DIR, theirs, ignore=shutil.ignore_patterns("__pycache__"))
    with (theirs / "train.py").open("a", encoding="utf-8") as script:
        script.write("\n# anything at all runs here, as the training role, with the data and the weights\n")
    archive = build_sourcedir(folder / "out", source=theirs).path.read_bytes()
    bucket = stack.ref("DataBucket")
    listed = stack.aws.s3.list_objects_v2(Bucket=bucket, Prefix="code/").get("Contents", [])
    archives = [item["Key"] for item in listed if item["Key"].endswith("/sourcedir.tar.gz")]
    assert archives, "the stack released no trainer to replace"
    for key in archives:
        stack.aws.s3.put_object(Bucket=bucket, Key=key, Body=archive)
    return hashlib.sha256(archive).hexdigest()


def test_a_replaced_trainer_is_refused_with_the_reason_and_trains_again_once_released_again(
    stack: OfflineStack, tmp_path: Path
) -> None:
    released = build_sourcedir(tmp_path / "released")  # what the stack released when it started
    inbox = stack.topic_inbox()
    theirs = replace_the_released_trainer(stack, tmp_path)
    drop_with_validation(stack, "munich-50", train=4, val=1)

    refused = run_to_end(stack)

    assert refused["status"] == "FAILED", "the run trained with code nobody released"
    assert job_names(stack) == [], "no training job was created"
    cause = refused["cause"]
    assert f"has sha256 {theirs}, but run {refused['name']} was started with {released.sha256}" in cause, cause
    assert "release the trainer again" in cause and f"retrain runs rerun {refused['name']}" in cause, cause
    assert history_states(stack, refused["executionArn"])[-5:] == [
        "Start training",
        "Stop the training job if one was created",
        "Release the lock after the failure",
        "Tell the team the run failed",
        "Run failed",
    ]
    summary = RunSummary.model_validate(read_json(stack, f"reports/failures/{refused['name']}/summary.json"))
    assert (summary.failed_state, summary.error) == ("Start training", "TrainerCodeMismatchError")
    assert summary.code_archive_sha256 == released.sha256
    (email,) = inbox.receive(wait_seconds=5)
    assert email["Subject"].startswith("Retraining failed at Start training"), email["Subject"]
    assert f"has sha256 {theirs}" in email["Message"], email["Message"]

    restored = release_trainer(stack.aws.s3, stack.ref("DataBucket"), released)  # `make upload-trainer`
    drop_with_validation(stack, "munich-51", train=4, val=1, skip=1)
    trained = run_to_end(stack, after=1)

    assert (restored.outcome, restored.replaced_sha256) == ("restored", theirs)
    assert trained["status"] == "SUCCEEDED", trained
    assert len(job_names(stack)) == 1
    summary = RunSummary.model_validate(read_json(stack, f"reports/runs/{trained['name']}/summary.json"))
    assert summary.code_archive_sha256 == released.sha256
