"""What a function is, what its handler receives and what becomes of its answer, as on AWS Lambda.

The runtime in this process (`lambdas.py`) and a worker process (`worker_process.py`) both call
handlers through this module, so the two cannot differ in the context they pass or in how an
exception or an answer that is not JSON becomes the invocation's error.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Handler = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class FunctionSpec:
    """A function as the template declares it."""

    logical_id: str
    name: str
    handler: str
    environment: dict[str, str]
    timeout_seconds: int = 3
    memory_mb: int = 128
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ReservedConcurrentExecutions: at most this many invocations at once; one more is throttled
    # (`LambdaRuntime.throttles`). None: the function draws on the account's unreserved pool.
    reserved_concurrency: int | None = None


class LambdaContext:
    """What the runtime passes as `context` (the attributes Powertools reads)."""

    def __init__(self, spec: FunctionSpec, arn: str, request_id: str) -> None:
        self.function_name = spec.name
        self.function_version = "$LATEST"
        self.invoked_function_arn = arn
        self.memory_limit_in_mb = spec.memory_mb
        self.aws_request_id = request_id
        self.log_group_name = f"/aws/lambda/{spec.name}"
        self.log_stream_name = f"local/{request_id}"
        self._deadline = time.monotonic() + spec.timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def call_handler(handler: Handler, event: Any, context: LambdaContext) -> tuple[Any, str | None]:
    """The handler's answer and None, or Lambda's error payload and the error's name."""
    try:
        result = handler(event, context)
    except Exception as exc:  # every handler error becomes a FunctionError, as on AWS
        return {
            "errorType": type(exc).__name__,
            "errorMessage": str(exc),
            "stackTrace": traceback.format_tb(exc.__traceback__),
        }, type(exc).__name__
    # The result goes back as JSON; something that cannot be serialised fails as on AWS.
    try:
        return json.loads(json.dumps(result)), None
    except (TypeError, ValueError) as exc:
        return {
            "errorType": "Runtime.MarshalError",
            "errorMessage": f"Unable to marshal response: {exc}",
        }, "Runtime.MarshalError"
