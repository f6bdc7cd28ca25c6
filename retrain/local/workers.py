"""Lambda execution environments as worker processes: concurrent invocations, warm starts.

With `StackOptions.lambda_concurrency` above one, each function gets up to that many execution
environments, as Lambda gives a function one per concurrent invocation. Each is a Python process
started on the function's first call that finds none free (its cold start: the handler module is
imported there, once), kept for the calls after it (warm starts), and stopped with the stack. Its
`os.environ` is exactly the function's (the stack's process environment, the base environment
and the template's variables), so nothing leaks from one function to another however many run
at once. When all of a function's environments are busy, the next call waits for one, as a
reserved concurrency throttles.

The parent and a worker speak JSON, one message a line, over the worker's stdin and stdout (the
worker moves its own stdout onto stderr first, so what a handler prints or logs never reaches the
protocol):

- parent -> worker `init` (the handler and the context's facts), worker -> `ready` or `init_error`;
- parent -> worker `invoke` (request id and event), worker -> `result` (payload, error name,
  start and end times, pid), with any number of `call` -> `answer` exchanges in between.

A `call` is an API call the worker cannot make over HTTP: `lambda:Invoke` (the gateway serves
the emulated JSON-protocol operations, FSx and SageMaker, to other processes; Lambda's API is
REST, so the worker hands its invokes to the parent, whose runtime starts the function). Every
other call goes from the worker to the stack's server through `AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from functions.common.errors import RetrainError

if TYPE_CHECKING:
    from retrain.local.lambdas import FunctionSpec

log = logging.getLogger(__name__)

# Lambda allows 10 s for the init phase; a loaded laptop importing boto3, pydantic and Powertools
# in several fresh processes at once needs more, and a slow start must not look like a failure.
INIT_TIMEOUT_SECONDS = 60.0
# The result of a function that ends just in time still has to cross the pipe.
RESULT_GRACE_SECONDS = 0.5
STOP_GRACE_SECONDS = 5.0
# The parent's `sys.path` is the worker's, so a handler importable here (tests/...) is there too.
BOOTSTRAP = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); from retrain.local.workers import main; main()"

CallHandler = Callable[[str, str, dict[str, Any]], dict[str, Any]]


class WorkerProtocolError(RetrainError):
    """A worker said something outside the protocol, or went away in the middle of it."""


class RuntimeStoppedError(RetrainError):
    """The runtime was closed: its execution environments are gone."""


class FunctionInitError(RetrainError):
    """A function's init phase failed: what Lambda reports as the invocation's error."""

    def __init__(self, error_type: str, message: str, trace: list[str] | None = None) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.trace = trace or []


class CallError(RetrainError):
    """An error answer to a worker's `call`, as the parent's emulator gave it."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


@dataclass(frozen=True)
class WorkerResult:
    """One invocation as a worker ran it."""

    payload: Any
    error_type: str | None
    started_at: float
    ended_at: float
    duration_seconds: float
    pid: int | None
    # False when the environment must not be used again (it timed out, exited, or failed to start).
    reusable: bool = True


def encode(value: Any) -> Any:
    """JSON-safe: bytes (Lambda's Payload) become {"__bytes__": base64}."""
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {str(key): encode(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    return value


def decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


class _Lines:
    """JSON messages, one a line, read from a pipe with a deadline."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._fd = stream.fileno()
        self._buffer = b""

    def read(self, deadline: float | None) -> dict[str, Any] | None:
        """The next message; None at end of file; TimeoutError past `deadline` (monotonic)."""
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise WorkerProtocolError(f"a worker sent {line[:200]!r}, not a message")
        return message


def _write(stream: IO[bytes], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


class ExecutionEnvironment:
    """One worker process hosting one function, one invocation at a time."""

    def __init__(self, spec: FunctionSpec, arn: str, environment: dict[str, str], generation: int) -> None:
        self.spec = spec
        self.function = spec.name
        self.generation = generation
        self._arn = arn
        self._environment = environment
        self._process: subprocess.Popen[bytes] | None = None
        self._lines: _Lines | None = None
        self._stopped = threading.Event()
        # While True, the invoking thread reads stdout: only it may close that pipe.
        self._busy = False

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None and not self._stopped.is_set()

    def start(self) -> None:
        """The cold start: a fresh process imports the handler inside the function's environment.

        Raises `FunctionInitError` when the import (module-level code) fails or takes too long."""
        self._busy = True
        try:
            self._start()
        finally:
            self._busy = False
            if self._stopped.is_set() and self._process is not None and self._process.stdout is not None:
                self._process.stdout.close()

    def _start(self) -> None:
        # S603: our own interpreter and module, no shell.
        process = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", BOOTSTRAP, json.dumps(sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._environment,
        )
        self._process = process
        assert process.stdin is not None
        assert process.stdout is not None
        self._lines = _Lines(process.stdout)
        if self._stopped.is_set():  # stopped while it was being started
            self.stop()
            raise RuntimeStoppedError(f"{self.function}: the runtime stopped while it started")
        spec = self.spec
        init = {
            "type": "init",
            "arn": self._arn,
            "spec": {
                "logical_id": spec.logical_id,
                "name": spec.name,
                "handler": spec.handler,
                "timeout_seconds": spec.timeout_seconds,
                "memory_mb": spec.memory_mb,
            },
        }
        try:
            _write(process.stdin, init)
            message = self._lines.read(time.monotonic() + INIT_TIMEOUT_SECONDS)
        except TimeoutError:
            self.stop()
            raise FunctionInitError(
                "Sandbox.Timedout", f"{self.function}: the init phase took more than {INIT_TIMEOUT_SECONDS:.0f} s"
            ) from None
        except (OSError, ValueError) as error:
            self.stop()
            raise FunctionInitError("Runtime.ExitError", f"{self.function}: the worker went away: {error}") from None
        if message is None or message.get("type") != "ready":
            self.stop()
            if message is not None and message.get("type") == "init_error":
                raise FunctionInitError(str(message["error_type"]), str(message["message"]), message.get("trace"))
            raise FunctionInitError("Runtime.ExitError", f"{self.function}: the worker exited during its init phase")

    def invoke(self, request_id: str, event: Any, on_call: CallHandler) -> WorkerResult:
        """Run one invocation; a worker that outlives the function's timeout is killed, as Lambda
        stops a function at its timeout (the environment is not used again)."""
        process, lines = self._process, self._lines
        assert process is not None
        assert process.stdin is not None
        assert lines is not None
        self._busy = True
        try:
            return self._invoke(process, lines, request_id, event, on_call)
        finally:
            self._busy = False
            if self._stopped.is_set() and process.stdout is not None:
                process.stdout.close()

    def _invoke(
        self, process: subprocess.Popen[bytes], lines: _Lines, request_id: str, event: Any, on_call: CallHandler
    ) -> WorkerResult:
        assert process.stdin is not None
        sent_at, sent = time.time(), time.monotonic()
        deadline = sent + self.spec.timeout_seconds + RESULT_GRACE_SECONDS
        try:
            _write(process.stdin, {"type": "invoke", "request_id": request_id, "event": event})
            while True:
                message = lines.read(deadline)
                if message is None:
                    break
                if message.get("type") == "call":
                    _write(process.stdin, self._answer(message, on_call))
                    continue
                if message.get("type") != "result":
                    raise WorkerProtocolError(f"{self.function}: unexpected message {message.get('type')!r}")
                return WorkerResult(
                    payload=message["payload"],
                    error_type=message["error_type"],
                    started_at=float(message["started_at"]),
                    ended_at=float(message["ended_at"]),
                    duration_seconds=float(message["duration_seconds"]),
                    pid=int(message["pid"]),
                )
        except TimeoutError:
            ended_at, duration = time.time(), time.monotonic() - sent
            self.stop(grace_seconds=0)  # killed now, as Lambda stops a function at its timeout
            return WorkerResult(
                payload={
                    "errorType": "Sandbox.Timedout",
                    "errorMessage": f"Task timed out after {self.spec.timeout_seconds:.2f} seconds",
                },
                error_type="Sandbox.Timedout",
                started_at=sent_at,
                ended_at=ended_at,
                duration_seconds=duration,
                pid=process.pid,
                reusable=False,
            )
        except (OSError, ValueError):
            pass  # the pipe broke or was closed (the stack stops): the worker is gone, as below
        # It is ending (end of its output): a moment for its exit status, then it is killed.
        self.stop(grace_seconds=1.0)
        return WorkerResult(
            payload={
                "errorType": "Runtime.ExitError",
                "errorMessage": f"RequestId: {request_id} Error: Runtime exited with error: "
                f"exit status {process.returncode}",
            },
            error_type="Runtime.ExitError",
            started_at=sent_at,
            ended_at=time.time(),
            duration_seconds=time.monotonic() - sent,
            pid=process.pid,
            reusable=False,
        )

    def _answer(self, message: dict[str, Any], on_call: CallHandler) -> dict[str, Any]:
        try:
            result = on_call(str(message["service"]), str(message["operation"]), decode(message["params"]))
        except CallError as error:
            return {"type": "answer", "error": {"code": error.code, "message": error.message, "status": error.status}}
        except Exception as error:  # the worker's call fails as a 500 would; the stack keeps going
            log.exception(
                "%s: a %s.%s call from its worker failed", self.function, message["service"], message["operation"]
            )
            return {"type": "answer", "error": {"code": "ServiceException", "message": str(error), "status": 500}}
        return {"type": "answer", "result": encode(result)}

    def close_input(self) -> None:
        """Tell the worker to end (at end of its input), without waiting for it."""
        self._stopped.set()
        process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError):  # it is gone already
                process.stdin.close()

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Close its stdin (a worker ends at end of input), then kill what is still there."""
        self.close_input()
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None and not self._busy:
            process.stdout.close()


@dataclass
class _Slot:
    """One function's environments: the idle ones, how many exist, and which generation is current."""

    idle: list[ExecutionEnvironment] = field(default_factory=list)
    live: int = 0
    generation: int = 0


class EnvironmentPool:
    """Up to `size` execution environments per function, started lazily and reused."""

    def __init__(
        self,
        size: int,
        *,
        environment: Callable[[FunctionSpec], dict[str, str]],
        arn: Callable[[str], str],
        on_call: CallHandler,
    ) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one environment per function, not {size}")
        self.size = size
        self._environment = environment
        self._arn = arn
        self._on_call = on_call
        self._slots: dict[str, _Slot] = {}
        self._running: set[ExecutionEnvironment] = set()
        self._closed = False
        self._changed = threading.Condition()

    @property
    def pids(self) -> set[int]:
        """The worker processes now running (tests check that none outlives the stack)."""
        with self._changed:
            return {pid for env in self._running if (pid := env.pid) is not None}

    def invoke(self, spec: FunctionSpec, request_id: str, event: Any) -> WorkerResult:
        try:
            env = self._acquire(spec)
        except FunctionInitError as error:
            now = time.time()
            payload = {"errorType": error.error_type, "errorMessage": error.message, "stackTrace": error.trace}
            return WorkerResult(payload, error.error_type, now, now, 0.0, None, reusable=False)
        try:
            result = env.invoke(request_id, event, self._on_call)
        except BaseException:
            self._forget(env)
            env.stop()
            raise
        self._release(env, reusable=result.reusable)
        return result

    def _acquire(self, spec: FunctionSpec) -> ExecutionEnvironment:
        """A free environment of `spec`'s function: an idle one (warm), a new one (cold) while
        there are fewer than `size`, or the first to come free (the throttle)."""
        with self._changed:
            while True:
                if self._closed:
                    raise RuntimeStoppedError("the Lambda runtime is stopped")
                slot = self._slots.setdefault(spec.name, _Slot())
                if slot.idle:
                    return slot.idle.pop()  # the most recently used, as Lambda prefers warm ones
                if slot.live < self.size:
                    slot.live += 1
                    env = ExecutionEnvironment(spec, self._arn(spec.name), self._environment(spec), slot.generation)
                    self._running.add(env)
                    break
                self._changed.wait()
        try:
            env.start()
        except BaseException:
            self._forget(env)
            raise
        return env

    def _release(self, env: ExecutionEnvironment, *, reusable: bool) -> None:
        with self._changed:
            slot = self._slots.get(env.function)
            if reusable and slot is not None and env.alive and env.generation == slot.generation and not self._closed:
                slot.idle.append(env)
                self._changed.notify_all()
                return
        self._forget(env)
        env.stop()

    def _forget(self, env: ExecutionEnvironment) -> None:
        with self._changed:
            if env in self._running:
                self._running.discard(env)
                self._slots[env.function].live -= 1
            self._changed.notify_all()

    def retire(self, name: str | None = None) -> None:
        """The next call of `name` (of every function when None) is a cold start: idle
        environments stop now, busy ones when their invocation ends."""
        with self._changed:
            slots = [slot for function, slot in self._slots.items() if name in (None, function)]
            idle: list[ExecutionEnvironment] = []
            for slot in slots:
                slot.generation += 1
                idle += slot.idle
                slot.idle = []
        for env in idle:
            self._forget(env)
            env.stop()

    def close(self) -> None:
        """Stop every worker: idle ones at the end of their input, busy ones killed now (their
        callers get `Runtime.ExitError`), as deleting a function ends its environments."""
        with self._changed:
            self._closed = True
            idle = {env for slot in self._slots.values() for env in slot.idle}
            busy = self._running - idle
            self._changed.notify_all()
        for env in idle:
            env.close_input()  # all of them first: they end together
        for env in busy:
            env.stop(grace_seconds=0)
        for env in idle:
            env.stop()
        with self._changed:
            self._running.clear()
            self._slots.clear()


# ------------------------------------------------------------------ worker side --
class _Channel:
    """The worker's end of the protocol; `call` may come from any of the handler's threads."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = threading.Lock()

    def receive(self) -> dict[str, Any] | None:
        line = self._reader.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    def send(self, message: dict[str, Any]) -> None:
        _write(self._writer, message)

    def call(self, service: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        from retrain.local.emulators import EmulatedServiceError  # noqa: PLC0415 (worker side only)

        with self._lock:
            self.send({"type": "call", "service": service, "operation": operation, "params": encode(params)})
            answer = self.receive()
        if answer is None:
            raise WorkerProtocolError("the stack went away during a call")
        if "error" in answer:
            error = answer["error"]
            raise EmulatedServiceError(str(error["code"]), str(error["message"]), int(error["status"]))
        result: dict[str, Any] = decode(answer["result"])
        return result


def main() -> None:
    """The worker: import one handler, then run invocations until the parent closes stdin."""
    import importlib  # noqa: PLC0415 (worker side only)

    from retrain.local.emulators import EmulatorRegistry  # noqa: PLC0415
    from retrain.local.lambdas import FunctionSpec, LambdaContext, call_handler  # noqa: PLC0415

    # The parent stops its workers; Ctrl-C in the terminal of `retrain local up` is for it alone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = _Channel(sys.stdin.buffer, os.fdopen(os.dup(1), "wb"))
    os.dup2(2, 1)  # from here on, fd 1 (print, Powertools' logger) is stderr, not the protocol
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # it was a pipe: logs would wait in a buffer
    init = channel.receive()
    if init is None or init.get("type") != "init":
        return
    spec = FunctionSpec(environment={}, **init["spec"])
    # Before the import: module-level code may create clients, and their invokes go to the parent.
    registry = EmulatorRegistry()
    registry.register("lambda", "Invoke", lambda params: channel.call("lambda", "Invoke", params))
    registry.install()
    module_name, _, attribute = spec.handler.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the init phase's error is the invocation's, as on AWS
        # Lambda's Python runtime names a failed import so; other errors keep their class's name.
        missing = isinstance(exc, ImportError)
        channel.send(
            {
                "type": "init_error",
                "error_type": "Runtime.ImportModuleError" if missing else type(exc).__name__,
                "message": f"Unable to import module '{module_name}': {exc}" if missing else str(exc),
                "trace": traceback.format_tb(exc.__traceback__),
            }
        )
        return
    handler = getattr(module, attribute, None)
    if not callable(handler):
        channel.send(
            {
                "type": "init_error",
                "error_type": "Runtime.HandlerNotFound",
                "message": f"Handler '{attribute}' missing on module '{module_name}'",
            }
        )
        return
    channel.send({"type": "ready", "pid": os.getpid()})
    while (message := channel.receive()) is not None:
        if message.get("type") != "invoke":
            continue
        context = LambdaContext(spec, init["arn"], str(message["request_id"]))
        started_at, started = time.time(), time.monotonic()
        payload, error_type = call_handler(handler, message["event"], context)
        duration, ended_at = time.monotonic() - started, time.time()
        channel.send(
            {
                "type": "result",
                "payload": payload,
                "error_type": error_type,
                "started_at": started_at,
                "ended_at": ended_at,
                "duration_seconds": duration,
                "pid": os.getpid(),
            }
        )
