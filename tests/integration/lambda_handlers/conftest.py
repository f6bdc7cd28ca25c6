"""Handlers called directly, under mock_aws, with the environment the template gives them.

The resources come from `template.yaml` (the offline stack's builder, with no poller and no
ticker), so a handler sees exactly the tables, bucket and queues it would see deployed; each call
imports the handler module afresh inside its function's environment, as a cold start does.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from functions.common import clients
from functions.common.settings import load_settings
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.lambda_runtime.contract import LambdaContext
from tests.integration.conftest import DATA, TRAINING

Handler = Callable[[dict[str, Any]], Any]


@pytest.fixture
def deployed() -> Iterator[OfflineStack]:
    options = StackOptions(parameters={**DATA, **TRAINING}, poll=False, tick=False)
    with OfflineStack(options) as stack:
        yield stack


@pytest.fixture
def handler(deployed: OfflineStack, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Handler]:
    """`handler("IntakeFunction", QUIET_PERIOD_SECONDS="0")`: that function's `lambda_handler`,
    called with an event (and, optionally, the Lambda context to pass)."""

    def cold_start(logical_id: str, **overrides: str) -> Handler:
        spec = deployed.runtime.spec(deployed.ref(logical_id))
        environment = {
            "AWS_REGION": deployed.options.region,
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "POWERTOOLS_TRACE_DISABLED": "true",
            **spec.environment,
            **overrides,
        }
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        load_settings.cache_clear()
        clients.reset()
        module_name, _, attribute = spec.handler.rpartition(".")
        sys.modules.pop(module_name, None)
        lambda_handler = getattr(importlib.import_module(module_name), attribute)

        def call(event: dict[str, Any], context: LambdaContext | None = None) -> Any:
            """Invoke with `event` and a fresh context (or `context`, such as one whose time runs out)."""
            context = context or LambdaContext(spec, deployed.runtime.arn(spec.name), str(uuid.uuid4()))
            return lambda_handler(event, context)

        return call

    return cold_start
