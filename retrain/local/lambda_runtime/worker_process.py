"""A worker process: one execution environment of one function, started by `workers.py`.

It starts in the function's environment (its `os.environ` is exactly the function's) with the file
descriptor of its end of a connection to the stack, imports the handler once (the cold start), and
runs one invocation at a time until the stack closes the connection. Its stdout and stderr are the
function's log, as on AWS; the protocol (`protocol.py`) has a descriptor of its own.
"""

from __future__ import annotations

import importlib
import io
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from retrain.local.endpoint.emulators import EmulatedServiceError, EmulatorRegistry
from retrain.local.lambda_runtime.contract import Handler, LambdaContext, call_handler
from retrain.local.lambda_runtime.protocol import (
    Answer,
    Call,
    CallFailed,
    Init,
    InitFailed,
    Invoke,
    Ready,
    WorkerProtocolError,
    WorkerResult,
)


class _Channel:
    """The worker's end of the connection; `call` may come from any of the handler's threads."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def receive(self) -> object | None:
        """The next message; None once the stack has closed its end."""
        try:
            message: object = self._connection.recv()
        except (EOFError, OSError):
            return None
        return message

    def send(self, message: object) -> None:
        with self._lock:
            self._connection.send(message)

    def call(self, service: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._connection.send(Call(service, operation, params))
            answer = self.receive()
        if answer is None:
            raise WorkerProtocolError("the stack went away during a call")
        if isinstance(answer, CallFailed):
            raise EmulatedServiceError(answer.code, answer.message, answer.status)
        if not isinstance(answer, Answer):
            raise WorkerProtocolError(f"the stack answered a call with {answer!r}")
        return answer.result


def main() -> None:
    """The worker: argv[1] is its `sys.path` (set by the bootstrap), argv[2] its connection's fd."""
    # The stack stops its workers; Ctrl-C in the terminal of `retrain local up` is for it alone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # not a terminal: logs would wait in a buffer
    channel = _Channel(Connection(int(sys.argv[2])))
    init = channel.receive()
    if not isinstance(init, Init):
        return
    # Before the import: module-level code may create clients, and their invokes go to the parent.
    registry = EmulatorRegistry()
    registry.register("lambda", "Invoke", lambda params: channel.call("lambda", "Invoke", params))
    registry.install()
    handler = _import_handler(init.spec.handler)
    if isinstance(handler, InitFailed):
        channel.send(handler)
        return
    channel.send(Ready(os.getpid()))
    # Until the stack closes the connection (receive answers None).
    while isinstance(message := channel.receive(), Invoke):
        context = LambdaContext(init.spec, init.arn, message.request_id)
        started_at, started = time.time(), time.monotonic()
        payload, error_type = call_handler(handler, message.event, context)
        duration, ended_at = time.monotonic() - started, time.time()
        channel.send(WorkerResult(payload, error_type, started_at, ended_at, duration, os.getpid()))


def _import_handler(path: str) -> Handler | InitFailed:
    """The init phase: the handler, or its error as Lambda's Python runtime names it."""
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the init phase's error is the invocation's, as on AWS
        trace = traceback.format_tb(exc.__traceback__)
        if isinstance(exc, ImportError):
            return InitFailed("Runtime.ImportModuleError", f"Unable to import module '{module_name}': {exc}", trace)
        return InitFailed(type(exc).__name__, str(exc), trace)
    handler = getattr(module, attribute, None)
    if not callable(handler):
        return InitFailed("Runtime.HandlerNotFound", f"Handler '{attribute}' missing on module '{module_name}'", [])
    return handler  # type: ignore[no-any-return]
