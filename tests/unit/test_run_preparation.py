"""The first states of an engineer's run: the dataset version is found and sized, the released
trainer is fixed for the run, and FSx is brought up to date with the curated zone, or, on a stack
that reads the dataset from S3, left alone.

No AWS: S3 and FSx are stubbed clients that answer exactly the calls each state must make (and
fail the test on any other).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.stub import Stubber

from functions.common.errors import DatasetVersionNotFoundError, InvalidRunInputError, TrainerCodeMissingError
from functions.common.models import RunContext, SyncState, TrainerCode
from functions.common.requests import RunInput, SyncRequest
from functions.dataset_sync.logic import NOT_NEEDED, DatasetSync, request_token
from functions.prepare_run.logic import RunPreparer
from tests.conftest import load_event
from tests.unit.fakes import body, stubbed

BUCKET = "retrain-data-123456789012-us-east-1"
VERSION = "ds-20261203-091500-4f1c2a9b"
MANIFEST = b'{"batch": "munich", "image": "a.jpg"}\n{"batch": "munich", "image": "b.jpg"}\n\n'
RUN = RunContext.model_validate(load_event("run_context.json"))
FILE_SYSTEM = "fs-0123456789abcdef0"
TASK = "task-0a1b2c3d4e5f60718"
CODE_SHA256 = "9c1e" * 16
RELEASE = b'{"sha256": "' + CODE_SHA256.encode() + b'", "released_at": "2026-12-01T08:00:00Z"}'


def _the_trainer_is_released(stub: Stubber, release: bytes = RELEASE) -> None:
    stub.add_response("get_object", {"Body": body(release)}, {"Bucket": BUCKET, "Key": "code/current.json"})


def test_a_first_run_learns_its_size_and_that_every_pair_is_new() -> None:
    with stubbed("s3") as (s3, stub):
        key = f"dataset/manifests/{VERSION}.jsonl"
        stub.add_response("get_object", {"Body": body(MANIFEST), "VersionId": "m1"}, {"Bucket": BUCKET, "Key": key})
        _the_trainer_is_released(stub)
        stub.add_client_error(
            "get_object", "NoSuchKey", expected_params={"Bucket": BUCKET, "Key": "models/accepted.json"}
        )

        run = RunPreparer(s3, BUCKET, poll_seconds=60, poll_max_seconds=300).prepare(
            RunInput.parse(load_event("run_input.json"))
        )

    assert (run.run, run.dataset_version, run.manifest_version_id) == (VERSION, VERSION, "m1")
    assert (run.pair_count, run.new_pairs, run.new_batches) == (2, 2, ["munich"])
    assert run.accepted is None, "the first run"
    assert (run.poll_seconds, run.poll_max_seconds) == (60, 300)


def test_a_run_fixes_the_released_trainer_by_its_sha256_when_it_starts() -> None:
    with stubbed("s3") as (s3, stub):
        stub.add_response("get_object", {"Body": body(MANIFEST)})
        _the_trainer_is_released(stub)
        stub.add_client_error("get_object", "NoSuchKey")  # no accepted model yet

        run = RunPreparer(s3, BUCKET, poll_seconds=60, poll_max_seconds=300).prepare(RunInput(dataset_version=VERSION))

    assert run.code == TrainerCode(uri=f"s3://{BUCKET}/code/{CODE_SHA256}/sourcedir.tar.gz", sha256=CODE_SHA256)


@pytest.mark.parametrize(
    ("release", "says"),
    [
        (None, r"no trainer has been released \(s3://.*/code/current.json is missing\): release the trainer"),
        (b'{"sha256": "latest"}', r"code/current.json does not name a released trainer: release the trainer"),
    ],
)
def test_a_run_on_a_stack_without_a_released_trainer_is_refused_by_name(release: bytes | None, says: str) -> None:
    with stubbed("s3") as (s3, stub):
        stub.add_response("get_object", {"Body": body(MANIFEST)})
        if release is None:
            stub.add_client_error("get_object", "NoSuchKey", http_status_code=404)
        else:
            _the_trainer_is_released(stub, release)

        with pytest.raises(TrainerCodeMissingError, match=says):
            RunPreparer(s3, BUCKET, poll_seconds=60, poll_max_seconds=300).prepare(RunInput(dataset_version=VERSION))


def test_a_run_on_a_version_that_was_never_frozen_fails_by_name() -> None:
    with stubbed("s3") as (s3, stub):
        stub.add_client_error("get_object", "NoSuchKey")

        with pytest.raises(DatasetVersionNotFoundError, match="has no manifest"):
            RunPreparer(s3, BUCKET, poll_seconds=60, poll_max_seconds=300).prepare(RunInput(dataset_version=VERSION))


def test_a_runs_input_is_read_with_the_executions_name_and_start() -> None:
    started = datetime(2026, 12, 3, 9, 15, 1, tzinfo=UTC)
    event = {"input": {"dataset_version": VERSION}, "execution": VERSION, "started_at": started.isoformat()}

    assert RunInput.parse(event) == RunInput(dataset_version=VERSION, execution=VERSION, started_at=started)
    with pytest.raises(InvalidRunInputError, match="must name a dataset version"):
        RunInput.parse({"input": {"version": VERSION}})


@pytest.mark.parametrize("action", ["start", "check"])
def test_a_stack_that_reads_the_dataset_from_s3_has_nothing_to_import(action: str) -> None:
    with stubbed("fsx") as (fsx, _):  # nothing queued: any FSx call fails the test
        sync = DatasetSync(fsx, BUCKET, file_system_id=None, timeout_seconds=3600).sync(
            SyncRequest.model_validate({"action": action, "run": RUN})
        )

    assert (sync.task_id, sync.lifecycle, sync.done, sync.wait_seconds) == (None, NOT_NEEDED, True, 0)


def test_a_start_imports_the_curated_zone_once_per_run() -> None:
    with stubbed("fsx") as (fsx, stub):
        task = {
            "TaskId": TASK,
            "Lifecycle": "PENDING",
            "Type": "IMPORT_METADATA_FROM_REPOSITORY",
            "CreationTime": datetime.now(UTC),
        }
        expected = {
            "Type": "IMPORT_METADATA_FROM_REPOSITORY",
            "FileSystemId": FILE_SYSTEM,
            "Paths": [f"s3://{BUCKET}/dataset/"],
            "Report": {"Enabled": False},
            "ClientRequestToken": request_token(RUN.run),  # a retried start gets the same task back
        }
        stub.add_response("create_data_repository_task", {"DataRepositoryTask": task}, expected)

        sync = DatasetSync(fsx, BUCKET, file_system_id=FILE_SYSTEM, timeout_seconds=3600).sync(
            SyncRequest(action="start", run=RUN)
        )

    assert (sync.task_id, sync.file_system_id, sync.lifecycle, sync.done) == (TASK, FILE_SYSTEM, "PENDING", False)


def test_a_look_at_a_finished_import_says_done_and_how_many_files_it_saw() -> None:
    started = SyncState(task_id=TASK, file_system_id=FILE_SYSTEM, lifecycle="PENDING", wait_seconds=0)
    with stubbed("fsx") as (fsx, stub):
        task = {
            "TaskId": TASK,
            "Lifecycle": "SUCCEEDED",
            "Type": "IMPORT_METADATA_FROM_REPOSITORY",
            "CreationTime": datetime.now(UTC),
            "Status": {"TotalCount": 12, "SucceededCount": 12, "FailedCount": 0},
        }
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": [task]}, {"TaskIds": [TASK]})

        sync = DatasetSync(fsx, BUCKET, file_system_id=FILE_SYSTEM, timeout_seconds=3600).sync(
            SyncRequest(action="check", run=RUN, sync=started)
        )

    assert (sync.lifecycle, sync.done, sync.files, sync.checks) == ("SUCCEEDED", True, 12, 1)
