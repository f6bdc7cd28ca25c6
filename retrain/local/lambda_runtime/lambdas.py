"""Run the real Lambda handlers of `functions/` in this process, as AWS Lambda would.

Each function gets the environment the template gives it, applied only for the length of one
invocation (one process hosts every function, so nothing may leak from one to another), and a
cold start of its own: its handler module is imported afresh inside that environment, so
module-level Powertools objects and settings see that function's variables. Invocations are
serialised: the environment is process-wide. An exception becomes a `FunctionError` whose error
name is the exception class, so the state machine's Retry and Catch behave as on AWS.

With a concurrency above one (`StackOptions.lambda_concurrency`, server mode), the handlers run
instead in worker processes, up to that many per function, at the same time (`workers.py`): the
same records, error names and timeouts, but concurrent, each process with its own environment.

A function's reserved concurrency (`ReservedConcurrentExecutions`) is kept as Lambda keeps it, in
both modes: an invocation is in flight from the moment it is admitted until it ends, and one that
finds that many of its function's invocations in flight is throttled, counted in `throttles` (the
offline stand-in for the function's AWS/Lambda `Throttles` metric, which FunctionThrottlesAlarm
sums). A synchronous `Invoke` is then refused with `TooManyRequestsException` (429) by the worker
processes, which the caller's botocore retries as it retries AWS's; everything else (an asynchronous `Invoke`, an
EventBridge target, a schedule, an SQS batch) is tried again after a backoff until it runs, as
Lambda's asynchronous queue retries a throttled event: never dropped. In this process an admitted
invocation may wait for its turn (one at a time) and is in flight meanwhile, as it would be running
on AWS, so a synchronous call is not refused here (it would only be refused for an invocation
that cannot run before it ends); the worker processes, truly concurrent, are the closer measure.

What the functions print (Powertools' JSON logs and its EMF metric documents, which CloudWatch
Logs receives on AWS) goes to this process's stdout, or to the `output` stream when one is given.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stdout
from dataclasses import dataclass
from typing import Any, TextIO

from functions.common import clients
from functions.common.settings import load_settings
from retrain.local.endpoint.emulators import EmulatedServiceError
from retrain.local.lambda_runtime.contract import FunctionSpec, Handler, LambdaContext, call_handler
from retrain.local.lambda_runtime.workers import CallError, EnvironmentPool, RuntimeStoppedError

log = logging.getLogger(__name__)

# Lambda's asynchronous queue retries a throttled event after 1 s, then at growing intervals up to
# 5 minutes; offline the same doubling, scaled down so that a test waits seconds, not minutes.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0


@dataclass(frozen=True)
class Invocation:
    """One finished invocation: the payload, and the error name when the handler raised."""

    function: str
    request_id: str
    payload: Any
    error_type: str | None
    duration_seconds: float
    # Wall-clock times (time.time()) around the handler, and the pid of the process that ran it
    # (this one when in-process; None when no process got as far as running it).
    started_at: float = 0.0
    ended_at: float = 0.0
    worker: int | None = None

    @property
    def failed(self) -> bool:
        return self.error_type is not None


class LambdaRuntime:
    """The functions of one stack: invoked in-process one at a time (`concurrency` 1), or in up to
    `concurrency` worker processes per function at once."""

    def __init__(
        self,
        *,
        region: str,
        account_id: str,
        base_environment: dict[str, str],
        concurrency: int = 1,
        output: TextIO | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"a function runs at least one invocation at a time, not {concurrency}")
        self.region = region
        self.account_id = account_id
        self.concurrency = concurrency
        self._base_environment = base_environment
        self._functions: dict[str, FunctionSpec] = {}
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.RLock()
        self.invocations: list[Invocation] = []
        # Per function: the invocations admitted and not yet ended, and the throttles so far
        # (every refused or postponed attempt counts, as each does in AWS/Lambda Throttles).
        self._admission = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self.throttles: Counter[str] = Counter()
        # Asynchronous invocations accepted (202) and not yet ended: Lambda's asynchronous queue.
        self._queued: Counter[str] = Counter()
        self._closed = threading.Event()
        self._output = output
        self._pool = (
            EnvironmentPool(
                concurrency,
                environment=self._worker_environment,
                arn=self.arn,
                on_call=self._answer_call,
                output=output,
            )
            if concurrency > 1
            else None
        )

    @property
    def worker_pids(self) -> set[int]:
        """The worker processes running now (none in-process)."""
        return set() if self._pool is None else self._pool.pids

    def close(self) -> None:
        """Stop the worker processes, busy or not (the stack calls it when it stops); a throttled
        invocation waiting for its retry is dropped."""
        self._closed.set()
        if self._pool is not None:
            self._pool.close()

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
        """One invocation as an event source makes it (an SQS batch, a schedule, the asynchronous
        queue): while the function's reserved concurrency is in use it is throttled and tried
        again after a backoff, until it runs. (Lambda's SQS event source would return a throttled
        batch to the queue instead; the template's mappings never exceed the reserved concurrency.)"""
        spec = self.spec(name_or_arn)
        delay = RETRY_FIRST_SECONDS
        while not self._admit(spec):
            if self._closed.wait(delay):
                raise RuntimeStoppedError(f"{spec.name}: the runtime stopped while a throttled invocation waited")
            delay = min(2 * delay, RETRY_MAX_SECONDS)
        try:
            return self._run(spec, event)
        finally:
            self._leave(spec)

    @property
    def in_flight(self) -> dict[str, int]:
        """The invocations of each function admitted and not yet ended."""
        with self._admission:
            return {name: count for name, count in self._in_flight.items() if count}

    @property
    def queued(self) -> dict[str, int]:
        """The asynchronous invocations of each function accepted and not yet ended (waiting for
        a retry after a throttle, or running)."""
        with self._admission:
            return {name: count for name, count in self._queued.items() if count}

    def _admit(self, spec: FunctionSpec, *, enforce: bool = True) -> bool:
        """Count the invocation in flight, or, when its reserved concurrency is all in use, a throttle."""
        with self._admission:
            limit = spec.reserved_concurrency
            if enforce and limit is not None and self._in_flight[spec.name] >= limit:
                self.throttles[spec.name] += 1
                return False
            self._in_flight[spec.name] += 1
            return True

    def _leave(self, spec: FunctionSpec) -> None:
        with self._admission:
            self._in_flight[spec.name] -= 1

    def _run(self, spec: FunctionSpec, event: Any) -> Invocation:
        request_id = str(uuid.uuid4())
        if self._pool is not None:
            # JSON there and back, as the in-process call's result is; the event too, here.
            result = self._pool.invoke(spec, request_id, json.loads(json.dumps(event)))
            payload, error_type, duration = result.payload, result.error_type, result.duration_seconds
            started_at, ended_at, worker = result.started_at, result.ended_at, result.pid
        else:
            with self._lock, self._environment(spec), self._printing():
                handler = self._handler(spec)
                context = LambdaContext(spec, self.arn(spec.name), request_id)
                started_at, started = time.time(), time.monotonic()
                payload, error_type = call_handler(handler, event, context)
                duration, ended_at = time.monotonic() - started, time.time()
            worker = os.getpid()
        if duration > spec.timeout_seconds and error_type != "Sandbox.Timedout":
            # AWS would have stopped the function; here it ran to the end, but its result is
            # discarded as AWS would never have delivered it.
            error_type = "Sandbox.Timedout"
            payload = {
                "errorType": error_type,
                "errorMessage": f"Task timed out after {spec.timeout_seconds:.2f} seconds",
            }
        invocation = Invocation(spec.name, request_id, payload, error_type, duration, started_at, ended_at, worker)
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
            with self._admission:
                self._queued[spec.name] += 1
            threading.Thread(
                target=self._invoke_later, args=(spec.name, event), name=f"lambda-{spec.name}", daemon=True
            ).start()
            return {"StatusCode": 202}
        # In this process an admitted invocation may only be waiting for its turn (it would be
        # running on AWS): refusing a synchronous call then would be an offline artifact, harsher
        # than Lambda. The worker processes, truly concurrent, refuse as Lambda does.
        if not self._admit(spec, enforce=self._pool is not None):
            raise EmulatedServiceError(
                "TooManyRequestsException",
                f"Rate Exceeded. {spec.name} has a reserved concurrency of {spec.reserved_concurrency}, all in use",
                status=429,
            )
        try:
            invocation = self._run(spec, event)
        finally:
            self._leave(spec)
        response: dict[str, Any] = {
            "StatusCode": 200,
            "ExecutedVersion": "$LATEST",
            "Payload": json.dumps(invocation.payload).encode(),
        }
        if invocation.failed:
            response["FunctionError"] = "Unhandled"
        return response

    def _invoke_later(self, name: str, event: Any) -> None:
        """An asynchronous invocation (throttled ones retried); one that finds the stack stopping
        is dropped, quietly."""
        try:
            self.invoke(name, event)
        except RuntimeStoppedError:
            log.info("%s: an asynchronous invocation was dropped, the stack is stopping", name)
        finally:
            with self._admission:
                self._queued[name] -= 1

    def cold_start(self, name: str) -> None:
        """Forget one function's imported handler and the cached settings (its next call is cold)."""
        with self._lock:
            self._handlers.pop(name, None)
            load_settings.cache_clear()
        if self._pool is not None:
            self._pool.retire(name)

    def cold_start_all(self) -> None:
        """Forget every imported handler, cached setting and client (a new stack starts cold)."""
        with self._lock:
            self._handlers.clear()
            load_settings.cache_clear()
            clients.reset()
        if self._pool is not None:
            self._pool.retire()

    def _answer_call(self, service: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """A worker's API call that only this process can serve: `lambda:Invoke`."""
        if (service, operation) != ("lambda", "Invoke"):
            raise CallError("UnknownOperationException", f"{service}.{operation} is not served to workers", 400)
        try:
            return self.handle_invoke(params)
        except EmulatedServiceError as error:
            raise CallError(error.code, error.message, error.status) from None

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

    def _variables(self, spec: FunctionSpec) -> dict[str, str]:
        """What `spec`'s function finds set: the base environment, Lambda's own, the template's."""
        return {
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

    def _worker_environment(self, spec: FunctionSpec) -> dict[str, str]:
        # The whole of the worker's os.environ: this process's (PATH, HOME, the fake credentials)
        # as an in-process function sees it, with the function's variables over it.
        return {**os.environ, **self._variables(spec)}

    def _printing(self) -> AbstractContextManager[object]:
        # The cold start too: Powertools' logger keeps the stdout it finds when it is created.
        # Process-wide while a function runs here (one at a time): what people read is printed
        # through a stream of its own (the demo's console), not through sys.stdout.
        return nullcontext() if self._output is None else redirect_stdout(self._output)

    @contextmanager
    def _environment(self, spec: FunctionSpec) -> Iterator[None]:
        variables = self._variables(spec)
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
