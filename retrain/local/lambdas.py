"""Run the real Lambda handlers of `functions/` in this process, as AWS Lambda would.

Each function gets the environment the template gives it, applied only for the length of one
invocation (one process hosts every function, so nothing may leak from one to another), and a
cold start of its own: its handler module is imported afresh inside that environment, so
module-level Powertools objects and settings see that function's variables. Invocations are
serialised: the environment is process-wide, and a reserved concurrency of one is how the
offline stack keeps it honest. An exception becomes a `FunctionError` whose error name is the
exception class, so the state machine's Retry and Catch behave as on AWS.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from functions.common import clients
from functions.common.settings import load_settings
from retrain.local.emulators import EmulatedServiceError

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


@dataclass(frozen=True)
class Invocation:
    """One finished invocation: the payload, and the error name when the handler raised."""

    function: str
    request_id: str
    payload: Any
    error_type: str | None
    duration_seconds: float

    @property
    def failed(self) -> bool:
        return self.error_type is not None


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


class LambdaRuntime:
    """The functions of one stack, invoked in-process."""

    def __init__(self, *, region: str, account_id: str, base_environment: dict[str, str]) -> None:
        self.region = region
        self.account_id = account_id
        self._base_environment = base_environment
        self._functions: dict[str, FunctionSpec] = {}
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.RLock()
        self.invocations: list[Invocation] = []

    def add(self, spec: FunctionSpec) -> None:
        self._functions[spec.name] = spec

    @property
    def functions(self) -> dict[str, FunctionSpec]:
        return dict(self._functions)

    def arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account_id}:function:{name}"

    def spec(self, name_or_arn: str) -> FunctionSpec:
        # FunctionName may be a name, a full ARN, or a partial ARN, with or without a qualifier.
        name = name_or_arn.split(":function:", 1)[-1].split(":", 1)[0]
        try:
            return self._functions[name]
        except KeyError:
            raise EmulatedServiceError(
                "ResourceNotFoundException",
                f"Function not found: {self.arn(name)}",
                status=404,
            ) from None

    def invoke(self, name_or_arn: str, event: Any) -> Invocation:
        spec = self.spec(name_or_arn)
        request_id = str(uuid.uuid4())
        with self._lock, self._environment(spec):
            handler = self._handler(spec)
            context = LambdaContext(spec, self.arn(spec.name), request_id)
            started = time.monotonic()
            payload, error_type = _call(handler, event, context)
            duration = time.monotonic() - started
        if duration > spec.timeout_seconds:
            # AWS would have stopped the function; here it ran to the end, but its result is
            # discarded as AWS would never have delivered it.
            error_type = "Sandbox.Timedout"
            payload = {
                "errorType": error_type,
                "errorMessage": f"Task timed out after {spec.timeout_seconds:.2f} seconds",
            }
        invocation = Invocation(spec.name, request_id, payload, error_type, duration)
        self.invocations.append(invocation)
        return invocation

    def handle_invoke(self, params: dict[str, Any]) -> dict[str, Any]:
        """The `lambda.Invoke` emulator: the API's request and response shapes."""
        spec = self.spec(params["FunctionName"])
        raw = params.get("Payload") or b"{}"
        try:
            event = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EmulatedServiceError(
                "InvalidRequestContentException", "Could not parse request body into json"
            ) from None
        invocation_type = params.get("InvocationType", "RequestResponse")
        if invocation_type == "DryRun":
            return {"StatusCode": 204}
        if invocation_type == "Event":
            threading.Thread(
                target=self.invoke, args=(spec.name, event), name=f"lambda-{spec.name}", daemon=True
            ).start()
            return {"StatusCode": 202}
        invocation = self.invoke(spec.name, event)
        response: dict[str, Any] = {
            "StatusCode": 200,
            "ExecutedVersion": "$LATEST",
            "Payload": json.dumps(invocation.payload).encode(),
        }
        if invocation.failed:
            response["FunctionError"] = "Unhandled"
        return response

    def cold_start(self, name: str) -> None:
        """Forget one function's imported handler and the cached settings (its next call is cold)."""
        with self._lock:
            self._handlers.pop(name, None)
            load_settings.cache_clear()

    def cold_start_all(self) -> None:
        """Forget every imported handler, cached setting and client (a new stack starts cold)."""
        with self._lock:
            self._handlers.clear()
            load_settings.cache_clear()
            clients.reset()

    def _handler(self, spec: FunctionSpec) -> Handler:
        handler = self._handlers.get(spec.name)
        if handler is None:
            module_name, _, attribute = spec.handler.rpartition(".")
            # A fresh import is the cold start: module-level code runs in this function's env.
            sys.modules.pop(module_name, None)
            module = importlib.import_module(module_name)
            handler = getattr(module, attribute)
            self._handlers[spec.name] = handler
        return handler

    @contextmanager
    def _environment(self, spec: FunctionSpec) -> Iterator[None]:
        variables = {
            **self._base_environment,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            # There is no X-Ray daemon offline.
            "POWERTOOLS_TRACE_DISABLED": "true",
            **spec.environment,
        }
        # Only the function's own variables are swapped (other threads keep reading theirs).
        saved = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _call(handler: Handler, event: Any, context: LambdaContext) -> tuple[Any, str | None]:
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
