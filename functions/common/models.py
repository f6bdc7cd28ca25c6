"""Payloads that cross a boundary: S3 notifications, the states' outputs, the accepted model.

What each function is invoked with (its request) is in `requests.py`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import unquote_plus

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from functions.common import prefixes

# StartExecution names: 1-80 characters, none of whitespace or <>{}[]?*"#%\^|~`$&,;:/.
_EXECUTION_NAME = r"^[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/]{1,80}$"
# Three names that are often the same string and must not be taken for one another:
# - a dataset version (`ds-<time>-<hash>`, its manifest `manifests/<version>.jsonl`): what a run
#   trains on; the trigger names a new run after its version, so it must be a valid run name too;
# - a run's name: its execution's name, its reports' folder and its lock's holder; a rerun
#   (`<version>-rerun-<time>`) or a manual start trains on a version under another name;
# - a lock's holder: a run's name, or a purge's (`purge:<time>-<random>`, never an execution).
DatasetVersion = Annotated[str, StringConstraints(pattern=_EXECUTION_NAME)]
RunName = Annotated[str, StringConstraints(pattern=_EXECUTION_NAME)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class S3ObjectEvent(BaseModel):
    """One object-created event, whatever emitted it (AWS, or moto with fewer fields)."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    key: str
    size: int = Field(ge=0)
    etag: str | None = None
    version_id: str | None = None
    # Orders the events of one key (AWS only; moto sends none): notifications arrive in any order.
    sequencer: str | None = None
    event_name: str
    event_time: datetime | None = None

    @property
    def batch(self) -> str | None:
        return prefixes.batch_of(self.key)


def written_before(sequencer: str | None, other: str | None) -> bool:
    """Whether the event with `sequencer` was written before the one with `other` (same key).

    S3's sequencers are hex strings of varying length: compare them left-padded with zeros, as S3's
    documentation says. Without both, nothing is known, so False: arrival order decides.
    """
    if not sequencer or not other:
        return False
    width = max(len(sequencer), len(other))
    return sequencer.upper().rjust(width, "0") < other.upper().rjust(width, "0")


def decode_key(raw: str) -> str:
    """S3 event keys are form-encoded: spaces arrive as `+`, `+` as `%2B`, moto also encodes `/`."""
    return unquote_plus(raw)


class AcceptedModel(BaseModel):
    """`models/accepted.json`: the model runs are compared with and start from."""

    model_config = ConfigDict(extra="ignore")

    run: str
    job_name: str
    dataset_version: str
    # The model's archive, pinned by VersionId: since issue 28 its sealed copy
    # (models/packages/<run>/model.tar.gz, with its SHA-256); before, SageMaker's output.
    model_uri: str
    model_version_id: str | None = None
    model_sha256: str | None = None
    # The folder holding its model.pt: the next training job's `model` channel.
    weights_prefix_uri: str
    miou: float = Field(ge=0.0, le=1.0)
    per_class_iou: dict[str, float | None] = Field(default_factory=dict)
    accepted_at: datetime
    model_package_arn: str | None = None


class TrainerRelease(BaseModel):
    """`code/current.json`, written by the release path only (`retrain package-trainer --stack`):
    the trainer that runs starting from now train with."""

    model_config = ConfigDict(extra="ignore")

    sha256: Sha256  # of sourcedir.tar.gz, which is at code/<sha256>/sourcedir.tar.gz
    released_at: datetime


class TrainerCode(BaseModel):
    """The trainer a run was started with: PrepareRun reads it from the release, and the training
    job is created only if the archive at `uri` still has this sha256."""

    model_config = ConfigDict(frozen=True)

    uri: str = Field(pattern=r"^s3://[^/]+/.+$")
    sha256: Sha256


class RunContext(BaseModel):
    """What every later state knows about the run."""

    run: str = ""  # the execution's name; an evaluation's reports go to reports/runs/<run>/
    execution_arn: str | None = None
    dataset_version: DatasetVersion
    manifest_uri: str
    manifest_version_id: str | None
    pair_count: int = Field(ge=0)
    # Pairs the accepted model was not trained on, and the batches they came in.
    new_pairs: int | None = Field(default=None, ge=0)
    new_batches: list[str] = Field(default_factory=list)
    # Whether the team wants a message when a run starts (one at the end is always sent).
    notify_on_start: bool = False
    started_at: datetime | None = None
    # The first wait of every polling loop, in seconds (tests: 0); loops back off from it.
    poll_seconds: int = Field(default=60, ge=0)
    # The longest wait between two looks (raised for long jobs: `functions/common/polling.py`).
    poll_max_seconds: int = Field(default=300, ge=1)
    # The model this run starts from and is compared with (None: the first run).
    accepted: AcceptedModel | None = None
    # The released trainer, fixed when the run starts (None: a run started before releases were
    # checked; it is refused at "Start training").
    code: TrainerCode | None = None


class SyncState(BaseModel):
    """The FSx import a run waits for (none, `NOT_NEEDED`, when training reads the dataset from S3)."""

    task_id: str | None
    file_system_id: str | None
    lifecycle: str
    done: bool = False
    wait_seconds: int = Field(ge=0)
    checks: int = Field(default=0, ge=0)
    files: int | None = None  # how many objects the import looked at, once it has ended


class JobState(BaseModel):
    """The training job a run waits for, as of the last look."""

    job_name: str
    job_arn: str
    status: str  # InProgress | Completed | Failed | Stopping | Stopped
    secondary_status: str | None = None
    # "training": the job runs; "rules": it ended, Debugger's rules are still being evaluated;
    # "done": job and rules have ended.
    phase: Literal["training", "rules", "done"] = "training"
    rules_pending: list[str] = Field(default_factory=list)
    wait_seconds: int = Field(ge=0)
    checks: int = Field(default=0, ge=0)
    created_at: datetime | None = None
    # When to give up waiting: MaxRuntime (+ MaxWait for spot) + a grace period after creation.
    deadline: datetime | None = None
    # The wait state's TimeoutSecondsPath: the job's limit, the safety poll's grace and an hour
    # more, so the poll's TrainingJobOverdueError (which names the job) normally comes first. A
    # Task with no timeout waits forever on AWS, and 60 s in moto's engine: set it always.
    wait_timeout_seconds: int = Field(default=30 * 86400, ge=1)
    already_existed: bool = False
    # Set by "Start training" when its execution had ended (ABORTED, TIMED_OUT, ...) by the time
    # the job existed: the job was stopped then (`functions/training_job/orphans.py`).
    run_ended: str | None = None


class RunFailure(BaseModel):
    """What a Catch hands the failure branch: the state that failed and its error."""

    model_config = ConfigDict(extra="ignore")

    state: str = "unknown"
    error: str = Field(default="Unknown", alias="Error")
    cause: str = Field(default="", alias="Cause")

    @field_validator("cause", mode="before")
    @classmethod
    def _no_cause_is_empty(cls, value: object) -> object:
        # SendTaskFailure's cause is optional: a failure from a task token may carry none.
        return "" if value is None else value

    @property
    def message(self) -> str:
        """The cause in words: a Lambda's error arrives as JSON (type, message, stack trace)."""
        try:
            document = json.loads(self.cause)
        except ValueError:
            return self.cause
        if isinstance(document, dict) and isinstance(document.get("errorMessage"), str):
            return str(document["errorMessage"])
        return self.cause


class RunState(BaseModel):
    """The whole state of a run as the failure branch receives it: what got that far."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    dataset_version: str | None = None
    run: RunContext | None = None
    sync: SyncState | None = None
    job: JobState | None = None
    failed_state: str | None = None
    error: dict[str, Any] | None = None

    @property
    def failure(self) -> RunFailure:
        return RunFailure.model_validate({**(self.error or {}), "state": self.failed_state or "unknown"})
