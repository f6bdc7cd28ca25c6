"""What the stack's process and a worker process say to each other, one object a message.

The two ends hold a `multiprocessing` connection: each message is one of these objects, pickled
by the library (bytes, such as Lambda's Payload, cross as they are). In order:

- parent -> `Init` (the function and its ARN); worker -> `Ready`, or `InitFailed` and it exits;
- parent -> `Invoke`; worker -> `WorkerResult`, with any number of `Call` -> `Answer` or
  `CallFailed` exchanges in between (a handler's API call that only the parent can serve).

A worker ends when the parent closes its end; a worker that ends otherwise (a crash, `os._exit`)
closes its end, and the parent reads that as the invocation's `Runtime.ExitError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from functions.common.errors import RetrainError
from retrain.local.lambda_runtime.contract import FunctionSpec


class WorkerProtocolError(RetrainError):
    """A worker said something outside the protocol, or went away in the middle of it."""


@dataclass(frozen=True)
class Init:
    spec: FunctionSpec
    arn: str


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class InitFailed:
    """The init phase failed (the handler's module could not be imported, or has no handler)."""

    error_type: str
    message: str
    trace: list[str]


@dataclass(frozen=True)
class Invoke:
    request_id: str
    event: Any


@dataclass(frozen=True)
class Call:
    """An API call the worker cannot make over HTTP: `lambda:Invoke` (the gateway serves the
    emulated JSON-protocol operations, FSx and SageMaker, to other processes; Lambda's API is
    REST, so the worker hands its invokes to the parent, whose runtime starts the function)."""

    service: str
    operation: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    result: dict[str, Any]


@dataclass(frozen=True)
class CallFailed:
    """The parent's emulator refused the call: the worker raises it as the service's error."""

    code: str
    message: str
    status: int


@dataclass(frozen=True)
class WorkerResult:
    """One invocation as a worker ran it (or as the parent saw it end)."""

    payload: Any
    error_type: str | None
    started_at: float
    ended_at: float
    duration_seconds: float
    pid: int | None
    # False when the environment must not be used again (it timed out, exited, or failed to start).
    reusable: bool = True
