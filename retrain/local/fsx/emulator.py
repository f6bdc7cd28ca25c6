"""FSx for Lustre, offline: file systems, data-repository associations and import tasks.

moto knows FSx file systems but not data-repository associations or tasks, so this emulator serves
every FSx call the system makes. A file system's "mount" is a local folder; an import task
(`IMPORT_METADATA_FROM_REPOSITORY`) makes the linked folder match the bucket prefix its association
names (new and changed objects copied, deleted ones removed), in the background, with the task's
life cycle as AWS reports it: PENDING -> EXECUTING -> SUCCEEDED | FAILED | CANCELED.

Where it is kinder than AWS: a real import brings metadata only and file contents load lazily on
first read; here the contents are copied at once. Auto-import (the association's
`AutoImportPolicy`) is recorded but not played: the import task is the barrier the state machine
waits for, on AWS and here alike.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from functions.common.errors import RetrainError
from functions.common.prefixes import split_s3_uri
from retrain.local.endpoint.emulators import EmulatedServiceError, EmulatorRegistry

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

IMPORT = "IMPORT_METADATA_FROM_REPOSITORY"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELED"})


@dataclass
class _FileSystem:
    description: dict[str, Any]
    mount: Path
    associations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.description["FileSystemId"])

    @property
    def mount_name(self) -> str:
        return str(self.description["LustreConfiguration"]["MountName"])


@dataclass
class _Task:
    description: dict[str, Any]
    token: str | None
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class FsxEmulator:
    """The FSx API for the offline stack; `mount_path` is where the trainer finds the data."""

    def __init__(
        self, *, s3: S3Client, workdir: Path, region: str, account_id: str, clock: Callable[[], datetime] | None = None
    ) -> None:
        self._s3 = s3
        self._workdir = workdir
        self._region = region
        self._account_id = account_id
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()
        self._file_systems: dict[str, _FileSystem] = {}
        self._tasks: dict[str, _Task] = {}
        self._failures: list[str] = []

    def register(self, registry: EmulatorRegistry) -> None:
        for operation, emulator in {
            "CreateFileSystem": self.create_file_system,
            "DescribeFileSystems": self.describe_file_systems,
            "CreateDataRepositoryAssociation": self.create_association,
            "DescribeDataRepositoryAssociations": self.describe_associations,
            "CreateDataRepositoryTask": self.create_task,
            "DescribeDataRepositoryTasks": self.describe_tasks,
            "CancelDataRepositoryTask": self.cancel_task,
        }.items():
            registry.register("fsx", operation, emulator)

    # ------------------------------------------------------------ for tests --
    def fail_next_task(self, message: str) -> None:
        """The next import task fails with `message` in its FailureDetails (as a task whose S3
        prefix the file system's role cannot read does)."""
        with self._lock:
            self._failures.append(message)

    def mount_path(self, file_system_id: str, directory_path: str) -> Path:
        """The local folder behind `/<MountName>/<sub/dir>` of a file system (what a training
        job's FileSystemDataSource mounts)."""
        with self._lock:
            found = self._file_systems.get(file_system_id)
        if found is None:
            raise EmulatedServiceError("ValidationException", f"File system {file_system_id} does not exist")
        parts = PurePosixPath(directory_path).parts
        if len(parts) < 2 or parts[0] != "/" or parts[1] != found.mount_name:
            raise EmulatedServiceError(
                "ValidationException",
                f"DirectoryPath {directory_path} must start with /{found.mount_name} "
                f"(the mount name of {file_system_id})",
            )
        return found.mount.joinpath(*parts[2:])

    def wait(self, task_id: str, timeout: float = 60) -> dict[str, Any]:
        with self._lock:
            task = self._tasks[task_id]
        if task.thread is not None:
            task.thread.join(timeout)
        return dict(task.description)

    def stop_all(self, timeout: float = 30) -> None:
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel.set()
        for task in tasks:
            if task.thread is not None:
                task.thread.join(timeout)

    # ---------------------------------------------------------- file systems --
    def create_file_system(self, params: dict[str, Any]) -> dict[str, Any]:
        if params["FileSystemType"] != "LUSTRE":
            raise EmulatedServiceError("BadRequest", "the offline stack emulates FSx for Lustre file systems only")
        file_system_id = f"fs-{uuid.uuid4().hex[:17]}"
        lustre = params.get("LustreConfiguration", {})
        description: dict[str, Any] = {
            "OwnerId": self._account_id,
            "CreationTime": self._clock(),
            "FileSystemId": file_system_id,
            "FileSystemType": "LUSTRE",
            "Lifecycle": "AVAILABLE",
            "StorageCapacity": params.get("StorageCapacity", 1200),
            "StorageType": params.get("StorageType", "SSD"),
            "SubnetIds": list(params["SubnetIds"]),
            "DNSName": f"{file_system_id}.fsx.{self._region}.amazonaws.com",
            "ResourceARN": self._arn("file-system", file_system_id),
            "LustreConfiguration": {
                "DeploymentType": lustre.get("DeploymentType", "SCRATCH_1"),
                "MountName": uuid.uuid4().hex[:8],
                **(
                    {"PerUnitStorageThroughput": lustre["PerUnitStorageThroughput"]}
                    if "PerUnitStorageThroughput" in lustre
                    else {}
                ),
            },
        }
        if params.get("Tags"):
            description["Tags"] = list(params["Tags"])
        mount = self._workdir / file_system_id
        mount.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._file_systems[file_system_id] = _FileSystem(description, mount)
        return {"FileSystem": description}

    def describe_file_systems(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            wanted = params.get("FileSystemIds") or list(self._file_systems)
            missing = [fs for fs in wanted if fs not in self._file_systems]
            if missing:
                raise EmulatedServiceError(
                    "FileSystemNotFound", f"File system '{missing[0]}' does not exist.", status=400
                )
            return {"FileSystems": [self._file_systems[fs].description for fs in wanted]}

    # ----------------------------------------------------------- associations --
    def create_association(self, params: dict[str, Any]) -> dict[str, Any]:
        file_system = self._file_system(params["FileSystemId"])
        repository = str(params["DataRepositoryPath"])
        if not repository.startswith("s3://"):
            raise EmulatedServiceError("BadRequest", "DataRepositoryPath must be an s3:// path")
        path = str(params.get("FileSystemPath", "/"))
        association_id = f"dra-{uuid.uuid4().hex[:17]}"
        association: dict[str, Any] = {
            "AssociationId": association_id,
            "ResourceARN": self._arn("association", f"{file_system.id}/{association_id}"),
            "FileSystemId": file_system.id,
            "Lifecycle": "AVAILABLE",
            "FileSystemPath": path,
            "DataRepositoryPath": repository,
            "BatchImportMetaDataOnCreate": bool(params.get("BatchImportMetaDataOnCreate", False)),
            "ImportedFileChunkSize": params.get("ImportedFileChunkSize", 1024),
            "CreationTime": self._clock(),
        }
        if "S3" in params:
            association["S3"] = params["S3"]
        with self._lock:
            overlapping = [a for a in file_system.associations if a["FileSystemPath"] == path]
            if overlapping:
                raise EmulatedServiceError(
                    "BadRequest", f"{path} of {file_system.id} is already linked to a repository"
                )
            file_system.associations.append(association)
        return {"Association": association}

    def describe_associations(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            found = [a for fs in self._file_systems.values() for a in fs.associations]
        if params.get("AssociationIds"):
            found = [a for a in found if a["AssociationId"] in params["AssociationIds"]]
        for name, values in _filters(params):
            if name == "file-system-id":
                found = [a for a in found if a["FileSystemId"] in values]
        return {"Associations": found}

    # ------------------------------------------------------------------ tasks --
    def create_task(self, params: dict[str, Any]) -> dict[str, Any]:
        file_system = self._file_system(params["FileSystemId"])
        if params["Type"] != IMPORT:
            raise EmulatedServiceError(
                "BadRequest", f"the offline stack runs {IMPORT} tasks only, not {params['Type']}"
            )
        token = params.get("ClientRequestToken")
        with self._lock:
            for task in self._tasks.values():
                same_fs = task.description["FileSystemId"] == file_system.id
                if token is not None and task.token == token and same_fs:
                    return {"DataRepositoryTask": dict(task.description)}  # an idempotent retry
            if any(
                t.description["FileSystemId"] == file_system.id and t.description["Lifecycle"] not in TERMINAL
                for t in self._tasks.values()
            ):
                raise EmulatedServiceError(
                    "DataRepositoryTaskExecuting",
                    f"A data repository task is already executing on {file_system.id}.",
                )
            task_id = f"task-{uuid.uuid4().hex[:17]}"
            description: dict[str, Any] = {
                "TaskId": task_id,
                "Lifecycle": "PENDING",
                "Type": IMPORT,
                "CreationTime": self._clock(),
                "ResourceARN": self._arn("task", task_id),
                "FileSystemId": file_system.id,
                "Paths": list(params.get("Paths", [])),
                "Report": params["Report"],
                "Status": {"TotalCount": 0, "SucceededCount": 0, "FailedCount": 0},
            }
            task = _Task(description, token)
            failure = self._failures.pop(0) if self._failures else None
            self._tasks[task_id] = task
        task.thread = threading.Thread(
            target=self._run_import,
            args=(task, file_system, failure),
            name=f"fsx-{task_id}",
            daemon=True,
        )
        task.thread.start()
        return {"DataRepositoryTask": dict(description)}

    def describe_tasks(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            tasks = [dict(t.description) for t in self._tasks.values()]
        if params.get("TaskIds"):
            missing = [i for i in params["TaskIds"] if i not in {t["TaskId"] for t in tasks}]
            if missing:
                raise EmulatedServiceError("DataRepositoryTaskNotFound", f"Task '{missing[0]}' does not exist.")
            tasks = [t for t in tasks if t["TaskId"] in params["TaskIds"]]
        for name, values in _filters(params):
            key = {"file-system-id": "FileSystemId", "task-lifecycle": "Lifecycle"}.get(name)
            if key is not None:
                tasks = [t for t in tasks if t[key] in values]
        return {"DataRepositoryTasks": tasks}

    def cancel_task(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            task = self._tasks.get(params["TaskId"])
            if task is None:
                raise EmulatedServiceError("DataRepositoryTaskNotFound", f"Task '{params['TaskId']}' does not exist.")
            if task.description["Lifecycle"] in TERMINAL:
                raise EmulatedServiceError(
                    "DataRepositoryTaskEnded",
                    f"Task {params['TaskId']} has already ended ({task.description['Lifecycle']}).",
                )
            task.description["Lifecycle"] = "CANCELING"
            task.cancel.set()
        return {"Lifecycle": "CANCELING", "TaskId": params["TaskId"]}

    def _run_import(self, task: _Task, file_system: _FileSystem, failure: str | None) -> None:
        self._update(task, Lifecycle="EXECUTING", StartTime=self._clock())
        if failure is not None:
            self._end(task, "FAILED", failure=failure)
            return
        counts = {"TotalCount": 0, "SucceededCount": 0, "FailedCount": 0}
        try:
            for association in list(file_system.associations):
                self._import(task, file_system, association, counts)
        except _Canceled:
            self._end(task, "CANCELED", counts=counts)
            return
        except Exception as error:
            self._end(task, "FAILED", counts=counts, failure=f"{type(error).__name__}: {error}")
            return
        self._end(task, "SUCCEEDED", counts=counts)

    def _import(
        self,
        task: _Task,
        file_system: _FileSystem,
        association: dict[str, Any],
        counts: dict[str, int],
    ) -> None:
        bucket, prefix = split_s3_uri(str(association["DataRepositoryPath"]))
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        linked = file_system.mount / association["FileSystemPath"].strip("/")
        wanted = [p for p in task.description["Paths"] if p.startswith(f"s3://{bucket}/{prefix}")]
        present: set[Path] = set()
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if wanted and not any(f"s3://{bucket}/{key}".startswith(p) for p in wanted):
                    continue
                if task.cancel.is_set():
                    raise _Canceled
                target = linked / key.removeprefix(prefix)
                present.add(target)
                counts["TotalCount"] += 1
                if not target.exists() or target.stat().st_size != item["Size"]:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with target.open("wb") as out:
                        shutil.copyfileobj(self._s3.get_object(Bucket=bucket, Key=key)["Body"], out)
                counts["SucceededCount"] += 1
        if not linked.exists():
            return
        # An object deleted in S3 disappears from the file system too (purged images).
        for path in sorted(linked.rglob("*"), reverse=True):
            uri = f"s3://{bucket}/{prefix}{path.relative_to(linked).as_posix()}"
            if path.is_file() and path not in present and (not wanted or any(uri.startswith(p) for p in wanted)):
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()

    def _update(self, task: _Task, **fields: Any) -> None:
        with self._lock:
            task.description.update(fields)

    def _end(
        self,
        task: _Task,
        lifecycle: str,
        *,
        counts: dict[str, int] | None = None,
        failure: str | None = None,
    ) -> None:
        update: dict[str, Any] = {"Lifecycle": lifecycle, "EndTime": self._clock()}
        if counts is not None:
            update["Status"] = {**counts, "LastUpdatedTime": self._clock()}
        if failure is not None:
            update["FailureDetails"] = {"Message": failure}
        self._update(task, **update)

    # -------------------------------------------------------------- helpers --
    def _file_system(self, file_system_id: str) -> _FileSystem:
        with self._lock:
            found = self._file_systems.get(file_system_id)
        if found is None:
            raise EmulatedServiceError("FileSystemNotFound", f"File system '{file_system_id}' does not exist.")
        return found

    def _arn(self, kind: str, resource: str) -> str:
        return f"arn:aws:fsx:{self._region}:{self._account_id}:{kind}/{resource}"


class _Canceled(RetrainError):  # noqa: N818 (control flow inside the task thread, never raised out)
    pass


def _filters(params: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(f["Name"], list(f.get("Values", []))) for f in params.get("Filters", [])]
