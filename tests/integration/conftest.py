"""The offline stack under mock_aws, as a fixture: the same code `retrain local up` runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from retrain.local.cloudformation.stack import OfflineStack, StackOptions

# Short enough to see redelivery and the dead-letter queue within a test.
FAST_QUEUE = {
    "FunctionTimeoutSeconds": "1",
    "IntakeVisibilityTimeoutSeconds": "1",
    "IntakeMaxReceiveCount": "2",
}


@pytest.fixture
def stack() -> Iterator[OfflineStack]:
    """A stack whose poller and ticker the test drives itself, one step at a time."""
    with OfflineStack(
        StackOptions(parameters=FAST_QUEUE, poll=False, tick=False, batching_window_seconds=0)
    ) as offline:
        yield offline


# Data drops: room for real validation work per invocation, and a trigger that starts a run as
# soon as one curated pair of a closed batch is ready (production waits for 500 or 6 hours).
DATA = {
    "FunctionTimeoutSeconds": "30",
    "IntakeVisibilityTimeoutSeconds": "30",
    "MinNewPairs": "1",
    "SettleSeconds": "0",
}


# A training job that finishes in seconds here: a narrow model, small crops, one emulated CPU
# host, and a look at the FSx import or the job every second (not 0: a loop with no wait keeps a
# core busy that the trainer needs, and writes hundreds of history events).
TRAINING = {
    "TrainingInstanceType": "ml.m5.xlarge",
    "TrainingInstanceCount": "1",
    "TrainingEpochs": "1",
    "TrainingWidth": "0.25",
    "TrainingBatchSize": "2",
    "TrainingCrop": "96x48",
    "TrainingExtraHyperparameters": '{"workers": 0}',
    "PollSeconds": "1",
    "PollMaxSeconds": "1",
}


@pytest.fixture
def data_stack(request: pytest.FixtureRequest) -> Iterator[OfflineStack]:
    """A stack for annotators' drops; parametrize it indirectly to override template parameters."""
    parameters = {**DATA, **TRAINING, **getattr(request, "param", {})}
    options = StackOptions(parameters=parameters, poll=False, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as offline:
        yield offline


@pytest.fixture
def running_stack() -> Iterator[OfflineStack]:
    """A stack with its poller running in the background, as `retrain local up` has it."""
    with OfflineStack(StackOptions(parameters=FAST_QUEUE, batching_window_seconds=0)) as offline:
        yield offline
