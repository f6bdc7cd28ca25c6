"""Bring the FSx for Lustre file system up to date with the curated zone before training.

The file system's data-repository association links its `/dataset` folder to the bucket's
`dataset/` prefix and auto-imports changes, but auto-import is eventually consistent: an import
task on that prefix is the barrier that says every object of the frozen version is visible on
the file system. A failed or cancelled task fails the run before any training starts.

A stack without a file system (`DatasetSource=s3`, no FILE_SYSTEM_ID) has nothing to import:
training reads `dataset/` from S3, and the sync is done from the start (`NOT_NEEDED`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.common.errors import AwsServiceBusyError, FsxImportFailedError
from functions.common.models import RunContext, SyncState
from functions.common.polling import next_wait
from functions.common.requests import SyncRequest

if TYPE_CHECKING:
    from mypy_boto3_fsx import FSxClient

IMPORT: Final = "IMPORT_METADATA_FROM_REPOSITORY"
ENDED_BADLY = frozenset({"FAILED", "CANCELED"})
_NOT_IN_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")


NOT_NEEDED: Final = "NOT_NEEDED"


def nothing_to_import(run: RunContext) -> SyncState:
    """Training reads s3://<bucket>/dataset/ itself (DatasetInput s3): no file system to bring up to date."""
    return SyncState(task_id=None, file_system_id=None, lifecycle=NOT_NEEDED, done=True, wait_seconds=0)


def request_token(run: str) -> str:
    """One import per run: a retried start sends the same token and gets the same task back."""
    digest = hashlib.sha256(run.encode()).hexdigest()[:16]
    return f"{_NOT_IN_TOKEN.sub('-', run)[:46]}-{digest}"


def start_import(fsx: FSxClient, *, file_system_id: str, bucket: str, run: RunContext) -> SyncState:
    try:
        task = fsx.create_data_repository_task(
            Type=IMPORT,
            FileSystemId=file_system_id,
            Paths=[f"s3://{bucket}/{prefixes.DATASET}"],
            Report={"Enabled": False},
            ClientRequestToken=request_token(run.run),
        )["DataRepositoryTask"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "DataRepositoryTaskExecuting":
            # Another import (an earlier run's, a person's) holds the file system: try again later.
            raise AwsServiceBusyError(
                f"FSx file system {file_system_id} is running another data-repository task"
            ) from error
        raise
    return SyncState(
        task_id=task["TaskId"],
        file_system_id=file_system_id,
        lifecycle=task["Lifecycle"],
        wait_seconds=run.poll_seconds,
    )


def check_import(
    fsx: FSxClient,
    sync: SyncState,
    *,
    run: RunContext,
    timeout_seconds: int,
    now: datetime | None = None,
) -> SyncState:
    """The task as it is now; raises `FsxImportFailedError` when it ended badly or took too long."""
    if sync.task_id is None:
        return sync  # nothing was imported (NOT_NEEDED): done from the start
    (task,) = fsx.describe_data_repository_tasks(TaskIds=[sync.task_id])["DataRepositoryTasks"]
    lifecycle = task["Lifecycle"]
    status = task.get("Status", {})
    if lifecycle in ENDED_BADLY:
        details = task.get("FailureDetails", {}).get("Message") or "no failure details given"
        raise FsxImportFailedError(
            f"the FSx import {sync.task_id} on {sync.file_system_id} ended {lifecycle}: {details} "
            f"({status.get('FailedCount', 0)} of {status.get('TotalCount', 0)} files failed); "
            "nothing was trained"
        )
    looked = sync.checks + 1
    if lifecycle != "SUCCEEDED":
        started = task.get("CreationTime") or now or datetime.now(UTC)
        if (now or datetime.now(UTC)) - started > timedelta(seconds=timeout_seconds):
            fsx.cancel_data_repository_task(TaskId=sync.task_id)
            raise FsxImportFailedError(
                f"the FSx import {sync.task_id} on {sync.file_system_id} was still {lifecycle} "
                f"after {timeout_seconds} s: cancelled; nothing was trained"
            )
    return sync.model_copy(
        update={
            "lifecycle": lifecycle,
            "done": lifecycle == "SUCCEEDED",
            "checks": looked,
            "wait_seconds": next_wait(run.poll_seconds, looked, run.poll_max_seconds),
            "files": status.get("TotalCount") if lifecycle == "SUCCEEDED" else None,
        }
    )


@dataclass(frozen=True)
class DatasetSync:
    fsx: FSxClient
    bucket: str
    file_system_id: str | None  # None: the stack reads the dataset from S3
    timeout_seconds: int  # an import still running after this long is cancelled

    def sync(self, request: SyncRequest) -> SyncState:
        """The import this state asks for: nothing, started, or as it is now."""
        if self.file_system_id is None:
            return nothing_to_import(request.run)
        if request.action == "start" or request.sync is None:
            return start_import(self.fsx, file_system_id=self.file_system_id, bucket=self.bucket, run=request.run)
        return check_import(self.fsx, request.sync, run=request.run, timeout_seconds=self.timeout_seconds)
