"""One error vocabulary for every function.

A Lambda's error name is its exception class, so these names are what the state machine's Retry
and Catch match, and what SQS redelivery and the DLQ show. Every error the project raises on
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


class ObjectGoneError(RetrainError):
    """The object version an event named is no longer there (deleted or purged)."""


class ConcurrentUpdateError(RetrainError):
    """Someone else changed the record between our read and our write (retried by SQS)."""
