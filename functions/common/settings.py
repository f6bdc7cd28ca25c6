"""Function settings: the environment the template gives each function, as pydantic models.

Each function declares its own settings class; `load_settings` reads it once per cold start
(cached per class), so two functions hosted in one process (the offline stack) never share one.
"""

from __future__ import annotations

from functools import cache
from typing import TypeVar

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from functions.common.errors import ConfigurationError


class FunctionSettings(BaseSettings):
    """What every function has: its region and its service name for logs, traces and metrics."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)

    aws_region: str = Field(min_length=1)
    powertools_service_name: str = Field(min_length=1)


class DataBucketSettings(FunctionSettings):
    data_bucket: str = Field(min_length=3, max_length=63)


class LedgerSettings(DataBucketSettings):
    ledger_table: str = Field(min_length=3)
    # Objects above this many bytes are copied in parts (`DataBucket.copy`); at most CopyObject's
    # limit of 5 GiB. Not in the template: only the offline tests lower it, to copy small objects
    # in parts.
    copy_multipart_threshold_bytes: int = Field(default=5 * 1024**3, ge=1, le=5 * 1024**3)


class IntakeSettings(LedgerSettings):
    idempotency_table: str = Field(min_length=3)
    # The stack's KMS key (the bucket's default): an upload encrypted otherwise is refused.
    data_key_arn: str = Field(pattern=r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-zA-Z-]+$")
    # Started (asynchronously) when a batch closes; empty: wait for the trigger's schedule.
    trigger_function: str = ""
    # Checking one file (decoding it) in the child process may take this long; then it is killed
    # and the file rejected as `decode_too_slow`. A 40 MP progressive JPEG of noise, the worst a
    # valid upload gets, takes 2.2 s on one x86 core; Lambda's 1024 MB is about 0.6 of a vCPU. The
    # time kept back before starting a record grows with it (`functions/intake/budget.py`).
    decode_timeout_seconds: float = Field(default=10.0, gt=0, le=30)
    # The queue's RedrivePolicy maxReceiveCount (template.yaml's IntakeMaxReceiveCount): a record
    # delivered this often is on its last try (`functions/intake/budget.py`).
    max_receive_count: int = Field(default=5, ge=1)
    # The intake queue itself: a record left unstarted for lack of time is sent to it again.
    # Empty: sent back as a failure instead (counting a delivery).
    intake_queue_url: str = ""


class SweeperSettings(LedgerSettings):
    quiet_period_seconds: int = Field(default=900, ge=0)
    incomplete_after_seconds: int = Field(default=3600, ge=0)
    trigger_function: str = ""


# The run lock's lease: longer than the state machine's own TimeoutSeconds (30 days: 28 of
# TrainingMaxRuntimeSeconds at most, plus the FSx import and evaluation), so no run outlives its
# lease. The trigger and PrepareRun ask Step Functions whether a run's execution is RUNNING
# whatever its lease says; the lease is for readers that cannot ask (a purge's dry run, trust).
LOCK_TTL_SECONDS = 31 * 24 * 3600


class TriggerSettings(LedgerSettings):
    state_machine_arn: str = Field(min_length=20)
    min_new_pairs: int = Field(default=500, ge=1)
    max_delay_seconds: int = Field(default=6 * 3600, ge=0)
    settle_seconds: int = Field(default=60, ge=0)
    lock_ttl_seconds: int = Field(default=LOCK_TTL_SECONDS, ge=60)
    val_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)


class ReleaseSettings(LedgerSettings):
    """ReleaseFunction frees a run's lock and kicks the trigger, which looks for new data."""

    trigger_function: str = Field(min_length=1)


class PrepareRunSettings(LedgerSettings):
    """The first state of a run reads the manifest (the layout comes from `prefixes`) and makes
    sure its execution holds the run lock, as the trigger would have it."""

    # The executions that hold the lock are this machine's (the trigger's STATE_MACHINE_ARN).
    state_machine_arn: str = Field(min_length=20)
    lock_ttl_seconds: int = Field(default=LOCK_TTL_SECONDS, ge=60)

    # The first wait of every polling loop of a run (the loops back off from it).
    poll_seconds: int = Field(default=60, ge=0)
    poll_max_seconds: int = Field(default=300, ge=1)
    notify_on_start: bool = False


class DatasetSyncSettings(DataBucketSettings):
    # None (FILE_SYSTEM_ID unset): the stack reads the dataset from S3 (DatasetInput s3), and a
    # run has nothing to import.
    file_system_id: str | None = Field(default=None, pattern=r"^fs-[0-9a-f]{8,}$")
    # An import still running after this long is cancelled and fails the run.
    import_timeout_seconds: int = Field(default=3 * 3600, ge=60)


class TrainingJobSettings(LedgerSettings):
    """The job itself is configured by `TRAINING_JOB_*` variables (`functions/training_job`); the
    ledger keeps each run's job name and the waits for jobs (`functions/data/ledger_jobs.py`)."""

    # Merged over TRAINING_JOB_HYPERPARAMETERS: the template's free-form JSON of trainer flags.
    training_extra_hyperparameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    # The runs' executions: a job whose run is no longer RUNNING is stopped
    # (`functions/training_job/orphans.py`).
    state_machine_arn: str = Field(min_length=20)


class RunEndedSettings(LedgerSettings):
    """The cleanup after a run that ended without its failure branch (`functions/run_ended`)."""

    notify_function: str = Field(min_length=1)
    release_function: str = Field(min_length=1)


class EvaluateRunSettings(LedgerSettings):
    gate_miou_tolerance: float = Field(default=0.01, ge=0.0, le=1.0)
    gate_class_tolerance: float = Field(default=0.05, ge=0.0, le=1.0)
    # Where accepted models are registered (PendingManualApproval); empty: not registered.
    model_package_group: str = ""


class NotifySettings(DataBucketSettings):
    notification_topic_arn: str = Field(min_length=20)
    # The run-end records (`run#<run>`/`end`), through which a run end's message is sent once.
    ledger_table: str = Field(min_length=3)
    # The secret holding the webhook URL, plain or as {"webhook_url": ...} (`notify/secret.py`); empty: no Slack.
    slack_webhook_secret_arn: str = ""
    # The role whose sessions sign report links (their expiry is known, so the message is true).
    report_reader_role_arn: str = ""


SettingsT = TypeVar("SettingsT", bound=FunctionSettings)


@cache
def load_settings(settings_class: type[SettingsT]) -> SettingsT:
    """Read and validate the environment once; a missing variable names itself in the error."""
    try:
        return settings_class()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']).upper()}: {error['msg']}" for error in exc.errors()
        )
        raise ConfigurationError(f"{settings_class.__name__} is invalid: {problems}") from exc
