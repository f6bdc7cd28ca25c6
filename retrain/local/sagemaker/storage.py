"""What SageMaker moves between S3, CloudWatch Logs and a training host, done with boto3.

Downloads before the container starts (the code archive, S3 channels, checkpoints) raise
`JobFailure` with the "ClientError: ..." reason SageMaker gives; uploads after it ends pack
`model/` and `output/data/` into `model.tar.gz` and `output.tar.gz` as SageMaker does.
"""

from __future__ import annotations

import logging
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from functions.common.errors import RetrainError
from functions.common.prefixes import split_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# PutLogEvents takes at most 10,000 events and 1 MiB (26 bytes of overhead each) per call.
_MAX_EVENTS, _MAX_BYTES, _EVENT_OVERHEAD = 1000, 1_000_000, 26
_MAX_MESSAGE = 200_000


class JobFailure(RetrainError):  # noqa: N818 (a job's end, not a programming error)
    """The job fails with this FailureReason."""


def join_uri(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def _client_error(error: ClientError, operation: str, uri: str, what: str) -> JobFailure:
    info = error.response.get("Error", {})
    code = info.get("Code", "Unknown")
    message = info.get("Message", str(error))
    return JobFailure(
        f"ClientError: An error occurred ({code}) when calling the {operation} operation: {message} ({what} {uri})"
    )


def download_object(s3: S3Client, uri: str, target: Path, *, what: str) -> None:
    bucket, key = split_s3_uri(uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        s3.download_file(bucket, key, str(target))
    except ClientError as error:
        raise _client_error(error, "GetObject", uri, what) from error


def download_prefix(s3: S3Client, uri: str, target: Path, *, required: bool, role: str) -> int:
    """Every object under the prefix into `target`, paths below the prefix kept; how many."""
    bucket, prefix = split_s3_uri(uri)
    count = 0
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                relative = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
                if key.endswith("/"):
                    continue  # a folder marker
                destination = target / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, key, str(destination))
                count += 1
    except ClientError as error:
        raise _client_error(error, "ListObjectsV2", uri, "channel") from error
    if required and count == 0:
        raise JobFailure(
            f'ClientError: No S3 objects found under S3 URL "{uri}" given in input data source. '
            f"Please ensure that the bucket exists in the selected region, that objects exist "
            f'under that S3 prefix, and that the role "{role}" has "s3:ListBucket" permissions '
            f'on bucket "{bucket}".'
        )
    return count


def upload_folder(s3: S3Client, folder: Path, uri: str) -> int:
    """Every file below `folder` under the prefix (checkpoints, rule output); how many."""
    bucket, prefix = split_s3_uri(uri)
    count = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            relative = path.relative_to(folder).as_posix()
            key = f"{prefix.rstrip('/')}/{relative}" if prefix.strip("/") else relative
            s3.upload_file(str(path), bucket, key)
            count += 1
    return count


def upload_tarball(s3: S3Client, folder: Path, scratch: Path, uri: str) -> None:
    """`folder`'s contents as one tar.gz (entries relative to it, as SageMaker packs them)."""
    scratch.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(scratch, "w:gz") as archive:
        for path in sorted(folder.rglob("*")):
            archive.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    bucket, key = split_s3_uri(uri)
    s3.upload_file(str(scratch), bucket, key)


def unpack(archive: Path, target: Path) -> None:
    with tarfile.open(archive, "r:*") as tar:
        # The "data" filter refuses absolute paths, links out of the folder and device files.
        tar.extractall(target, filter="data")


def has_files(folder: Path) -> bool:
    return folder.is_dir() and any(path.is_file() for path in folder.rglob("*"))


class LogStream:
    """One host's CloudWatch log stream, `<job>/algo-<n>-<epoch seconds>` as SageMaker names
    them; lines are buffered and sent by `flush()` (logging trouble never fails a job)."""

    def __init__(self, logs: CloudWatchLogsClient | None, job_name: str, host: str) -> None:
        self._logs = logs
        self.name = f"{job_name}/{host}-{int(time.time())}"
        self._pending: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._ready = False

    def add(self, line: str) -> None:
        if self._logs is None:
            return
        with self._lock:
            self._pending.append((int(time.time() * 1000), line[:_MAX_MESSAGE] or " "))

    def open(self) -> None:
        """Create the group and the stream now (SageMaker has one per host from its start)."""
        try:
            self._create()
        except (BotoCoreError, ClientError):
            log.warning("could not create the CloudWatch log stream %s", self.name, exc_info=True)

    def flush(self) -> None:
        if self._logs is None:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        # PutLogEvents wants its events in time order (stdout and stderr interleave).
        pending.sort(key=lambda event: event[0])
        try:
            self._create()
            for batch in _batches(pending):
                self._logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=self.name, logEvents=batch)
        except (BotoCoreError, ClientError):
            log.warning("could not send the log lines of %s to CloudWatch", self.name, exc_info=True)

    def _create(self) -> None:
        if self._ready or self._logs is None:
            return
        logs, stream = self._logs, self.name
        _unless_exists(lambda: logs.create_log_group(logGroupName=LOG_GROUP))
        _unless_exists(lambda: logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream))
        self._ready = True


def _unless_exists(create: Callable[[], object]) -> None:
    try:
        create()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceAlreadyExistsException":
            raise


def _batches(events: list[tuple[int, str]]) -> list[list[Any]]:
    batches: list[list[Any]] = [[]]
    size = 0
    for stamp, message in events:
        cost = len(message.encode()) + _EVENT_OVERHEAD
        if batches[-1] and (len(batches[-1]) >= _MAX_EVENTS or size + cost > _MAX_BYTES):
            batches.append([])
            size = 0
        batches[-1].append({"timestamp": stamp, "message": message})
        size += cost
    return batches
