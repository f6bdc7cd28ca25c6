"""One error vocabulary for every function.

A Lambda's error name is its exception class, so these names are what the state machine's Retry
and Catch match, and what SQS redelivery and the DLQ show. The state machine retries by name only
what can pass (`AwsServiceBusyError`, Lambda's own transient errors); every other error here goes
to the failure branch at once (a missing dataset version is not retried), and the notifier tells
"stopped" from "failed" by name (`TrainingJobStoppedError`). Every error the project raises on
purpose derives from `RetrainError`; the training-job request's own errors are in
`functions/training_job/errors.py`. Rename one only together with the ASL states that name it.
"""

from __future__ import annotations


class RetrainError(Exception):
    """Base of every error the project raises on purpose."""


class ConfigurationError(RetrainError):
    """A function's environment is missing or has an invalid setting (a deployment mistake)."""


class InvalidRunInputError(RetrainError):
    """The state machine was started with input that does not describe a dataset version."""


class DatasetVersionNotFoundError(RetrainError):
    """The manifest of the requested dataset version is not in the data bucket."""


class InvalidEventError(RetrainError):
    """An event does not have the shape its source documents (not retried: it never will)."""


class RefusedEventError(RetrainError):
    """An event the intake must not act on: another bucket's, outside `incoming/`, or not an
    object creation (a forged or misrouted message). Never retried, and the object is not touched."""


class ObjectGoneError(RetrainError):
    """The object version an event named is no longer there (deleted or purged)."""


class ConcurrentUpdateError(RetrainError):
    """Someone else changed the record between our read and our write (retried by SQS)."""


class EncryptionRefusedError(RetrainError):
    """An object is encrypted otherwise than with the stack's KMS key (SSE-C, SSE-S3, another KMS
    key). The bucket policy refuses such uploads; one that still arrives cannot (or may not) be
    read or copied, so it is refused where it lies, never retried into the DLQ."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class ObjectTooLargeError(RetrainError):
    """An object is larger than the intake moves: copying it (up to 5 TB, in parts) would outlast
    the function, so it is refused where it lies, never retried into the DLQ."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        super().__init__(f"{key}: {size} bytes, over the {limit} bytes the intake moves")
        self.key = key
        self.size = size
        self.limit = limit


class IntakeOutOfTimeError(RetrainError):
    """Too little of the invocation was left to start this record: it goes back to the queue
    unstarted (a partial batch failure) instead of being cut off by the timeout."""


# ---- a retraining run: the state machine reacts to each of these by name ----
class AwsServiceBusyError(RetrainError):
    """AWS throttled or failed a call beyond botocore's own retries: the state retries later."""


class FsxImportFailedError(RetrainError):
    """The FSx data-repository import ended FAILED or CANCELED: nothing is trained on stale data."""


class TrainerCodeMissingError(RetrainError):
    """No trainer was released (`code/current.json`), or the archive a run was started with is gone."""


class TrainerCodeMismatchError(RetrainError):
    """The trainer's archive no longer has the sha256 the run was started with: someone replaced the
    released code. Refused before the training job is created; not retried."""


class TrainingJobFailedError(RetrainError):
    """SageMaker reports the training job Failed; the message carries its FailureReason."""


class TrainingJobStoppedError(RetrainError):
    """The training job was stopped (by a person, or at its MaxRuntime) before it completed."""


class TrainingJobOverdueError(RetrainError):
    """The job ran past every limit it was given (MaxRuntime, spot wait, a grace period)."""


class RunArtifactsMissingError(RetrainError):
    """A completed job's output lacks what evaluation needs (model.tar.gz, metrics.json)."""


class DebuggerResultsError(RetrainError):
    """A DescribeTrainingJob response or a Debugger report file does not have the documented
    shape, so its rule results cannot be normalised."""


class EvidenceConflictError(RetrainError):
    """A run's evidence (its model's sealed copy `models/packages/<run>/model.tar.gz`, its
    `metrics.json`) already holds other bytes than this evaluation's, as when a job overwrote the
    archive before a retry: evidence is never replaced, so the run fails."""


class RunCleanupError(RetrainError):
    """A step of the cleanup after a stopped or timed-out run failed (EventBridge's asynchronous
    invocation is retried; every step is idempotent)."""


class RunEndMessagePendingError(RetrainError):
    """Another sender holds the claim on the message about a run's end past our wait
    (`functions/notify/once.py`): tried again later, never taken for sent."""


class LockHeldByAnotherRunError(RetrainError):
    """PrepareRun: another execution that is RUNNING (or a purge) holds the run lock, so this one
    would train beside it. Not retried; the failure branch stops nothing (no job was created),
    tells the team, and its release frees nothing (the lock is not this execution's)."""
