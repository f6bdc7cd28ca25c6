"""One error vocabulary for every function.

The state machine catches errors by name (a Lambda's error name is its exception class), so these
names are part of the contract with `statemachine/retrain.asl.json`: rename one only together with
the ASL states that catch it.
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
