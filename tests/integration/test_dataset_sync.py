"""Before training, FSx must show exactly the curated zone: the import task is the barrier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from functions.common.errors import FsxImportFailedError
from functions.common.models import RunContext, SyncState
from functions.dataset_sync.logic import check_import, start_import
from retrain.local.cloudformation.stack import OfflineStack, StackOptions


@pytest.fixture
def stack() -> Iterator[OfflineStack]:
    with OfflineStack(StackOptions(poll=False, tick=False, upload_trainer=False)) as offline:
        yield offline


def _run(name: str = "ds-20261203-120000-abcdef12") -> RunContext:
    return RunContext(
        run=name,
        dataset_version=name,
        manifest_uri="s3://b/k",
        manifest_version_id=None,
        pair_count=1,
        poll_seconds=0,
    )


def _import(stack: OfflineStack, run: RunContext) -> SyncState:
    sync = start_import(
        stack.aws.fsx,
        file_system_id=stack.ref("DatasetFileSystem"),
        bucket=stack.ref("DataBucket"),
        run=run,
    )
    assert stack.fsx is not None
    stack.fsx.wait(sync.task_id)
    return check_import(stack.aws.fsx, sync, run=run, timeout_seconds=600)


def _mount(stack: OfflineStack) -> str:
    file_system = stack.aws.fsx.describe_file_systems()["FileSystems"][0]
    return f"/{file_system['LustreConfiguration']['MountName']}/dataset"


def test_an_import_shows_the_curated_zone_on_the_file_system_and_forgets_what_was_erased(
    stack: OfflineStack,
) -> None:
    s3, bucket = stack.aws.s3, stack.ref("DataBucket")
    s3.put_object(Bucket=bucket, Key="dataset/images/b1/x.jpg", Body=b"jpeg")
    s3.put_object(Bucket=bucket, Key="dataset/manifests/ds-1.jsonl", Body=b"{}\n")
    s3.put_object(Bucket=bucket, Key="incoming/b2/images/y.jpg", Body=b"not curated")
    assert _import(stack, _run("first")).done
    s3.delete_object(Bucket=bucket, Key="dataset/images/b1/x.jpg")

    sync = _import(stack, _run("second"))

    assert stack.fsx is not None
    mount = stack.fsx.mount_path(stack.ref("DatasetFileSystem"), _mount(stack))
    assert sorted(p.relative_to(mount).as_posix() for p in mount.rglob("*") if p.is_file()) == ["manifests/ds-1.jsonl"]
    assert (sync.lifecycle, sync.done, sync.files) == ("SUCCEEDED", True, 1)


def test_a_retried_start_finds_the_import_its_first_attempt_began(stack: OfflineStack) -> None:
    args = {
        "file_system_id": stack.ref("DatasetFileSystem"),
        "bucket": stack.ref("DataBucket"),
        "run": _run(),
    }

    first = start_import(stack.aws.fsx, **args)
    again = start_import(stack.aws.fsx, **args)

    assert again.task_id == first.task_id
    assert len(stack.aws.fsx.describe_data_repository_tasks()["DataRepositoryTasks"]) == 1


def test_a_failed_import_fails_the_run_with_what_fsx_said(stack: OfflineStack) -> None:
    assert stack.fsx is not None
    stack.fsx.fail_next_task("Access denied to s3://bucket/dataset/ for the file system's role")

    with pytest.raises(
        FsxImportFailedError,
        match=r"ended FAILED: Access denied to s3://bucket/dataset/.*nothing was trained",
    ):
        _import(stack, _run())


def test_a_training_job_cannot_mount_another_file_system_or_path(stack: OfflineStack) -> None:
    assert stack.fsx is not None
    with pytest.raises(Exception, match="does not exist"):
        stack.fsx.mount_path("fs-0123456789abcdef0", "/x/dataset")
    with pytest.raises(Exception, match="must start with"):
        stack.fsx.mount_path(stack.ref("DatasetFileSystem"), "/wrongname/dataset")
