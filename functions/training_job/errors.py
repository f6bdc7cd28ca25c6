"""Errors of the training-job request, in the vocabulary of `functions.common.errors`.

The state machine catches them by name (a Lambda's error name is its exception class).
"""

from __future__ import annotations

from functions.common.errors import RetrainError


class JobConfigurationError(RetrainError):
    """The job configuration asks for something SageMaker cannot run, or is malformed.

    The message says what is wrong and how to proceed; `reasons` holds one line per problem, so a
    command-line tool can print them all and a test can look for one.
    """

    def __init__(self, reasons: list[str] | str) -> None:
        self.reasons = [reasons] if isinstance(reasons, str) else list(reasons)
        super().__init__("; ".join(self.reasons))


class UnsupportedRegionError(JobConfigurationError):
    """No image this project needs (the PyTorch training image, Debugger's rule evaluator) is
    published in the region."""


class TrainingRequestInvalidError(RetrainError):
    """A built CreateTrainingJob request breaks botocore's model or a limit SageMaker checks on its
    side: a bug in the builder or a value that slipped past the configuration's checks."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("the CreateTrainingJob request is invalid: " + "; ".join(self.problems))


class JobConfigFileError(JobConfigurationError):
    """The job configuration file cannot be read or is not a JSON/YAML mapping."""
