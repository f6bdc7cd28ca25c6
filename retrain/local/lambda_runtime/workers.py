"""Lambda execution environments as worker processes: concurrent invocations, warm starts.

With `StackOptions.lambda_concurrency` above one, each function gets up to that many execution
environments, as Lambda gives a function one per concurrent invocation. Each is a Python process
started on the function's first call that finds none free (its cold start: the handler module is
imported there, once), kept for the calls after it (warm starts), and stopped with the stack. Its
`os.environ` is exactly the function's (the stack's process environment, the base environment
and the template's variables), so nothing leaks from one function to another however many run
at once. When all of a function's environments are busy, the next call waits for one: a limit of
this machine, not a throttle (a function's reserved concurrency is kept, and its throttles
counted, by the runtime before a call gets here: `lambdas.py`).

The stack and a worker hold the two ends of a `multiprocessing.Pipe` and exchange the objects of
`protocol.py`, pickled by the library; the worker's stdout and stderr stay free for what the
handler prints and logs. The worker is started with `subprocess` (its end of the pipe passed by
descriptor), not as a `multiprocessing.Process`: its environment is the function's from its first
instruction, and it does not re-import this process's `__main__` (pytest, the CLI). The
thread that runs an invocation is the only one reading its environment's connection, and the
deadline of each read is the function's timeout: a worker still busy then is killed, as Lambda
stops a function, and one that ends mid-invocation is the invocation's `Runtime.ExitError`.
Every other API call goes from the worker to the stack's server through `AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import IO, Any

from functions.common.errors import RetrainError
from retrain.local.lambda_runtime.contract import FunctionSpec
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

log = logging.getLogger(__name__)

# Lambda allows 10 s for the init phase; a loaded laptop importing boto3, pydantic and Powertools
# in several fresh processes at once needs more, and a slow start must not look like a failure.
INIT_TIMEOUT_SECONDS = 60.0
# The result of a function that ends just in time still has to cross the connection.
RESULT_GRACE_SECONDS = 0.5
STOP_GRACE_SECONDS = 5.0
# The parent's `sys.path` is the worker's, so a handler importable here (tests/...) is there too.
BOOTSTRAP = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from retrain.local.lambda_runtime.worker_process import main; main()"
)

CallHandler = Callable[[str, str, dict[str, Any]], dict[str, Any]]


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
    """An error answer to a worker's `Call`, as the parent's emulator gave it."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


class ExecutionEnvironment:
    """One worker process hosting one function, one invocation at a time."""

    def __init__(
        self,
        spec: FunctionSpec,
        arn: str,
        environment: dict[str, str],
        generation: int,
        output: IO[str] | None = None,
    ) -> None:
        self.spec = spec
        self.function = spec.name
        self.generation = generation
        self._arn = arn
        self._environment = environment
        self._output = output
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._closing = threading.Lock()
        self._stopped = threading.Event()
        # The thread starting the worker or running an invocation: while there is one, it alone
        # reads the connection, and only it may close it (a stopping thread kills the worker).
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None and not self._stopped.is_set()

    def start(self) -> None:
        """The cold start: a fresh process imports the handler inside the function's environment.

        Raises `FunctionInitError` when the import (module-level code) fails or takes too long."""
        self._reader = threading.current_thread()
        try:
            self._start()
        finally:
            self._done_reading()

    def _start(self) -> None:
        ours, theirs = Pipe()
        try:
            # S603: our own interpreter and module, no shell; the worker's end is passed by number.
            self._process = subprocess.Popen(  # noqa: S603
                [sys.executable, "-c", BOOTSTRAP, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdout=self._output,
                stderr=self._output,
                env=self._environment,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the worker holds it now: its exit is the end of our reads
        self._connection = ours
        if self._stopped.is_set():  # stopped while it was being started
            self.stop()
            raise RuntimeStoppedError(f"{self.function}: the runtime stopped while it started")
        try:
            ours.send(Init(self.spec, self._arn))
            message = _receive(ours, time.monotonic() + INIT_TIMEOUT_SECONDS)
        except TimeoutError:
            self.stop()
            raise FunctionInitError(
                "Sandbox.Timedout", f"{self.function}: the init phase took more than {INIT_TIMEOUT_SECONDS:.0f} s"
            ) from None
        except OSError as error:
            self.stop()
            raise FunctionInitError("Runtime.ExitError", f"{self.function}: the worker went away: {error}") from None
        if not isinstance(message, Ready):
            self.stop()
            if isinstance(message, InitFailed):
                raise FunctionInitError(message.error_type, message.message, message.trace)
            raise FunctionInitError("Runtime.ExitError", f"{self.function}: the worker exited during its init phase")

    def invoke(self, request_id: str, event: Any, on_call: CallHandler) -> WorkerResult:
        """Run one invocation; a worker that outlives the function's timeout is killed, as Lambda
        stops a function at its timeout (the environment is not used again)."""
        self._reader = threading.current_thread()
        try:
            process, connection = self._process, self._connection
            assert process is not None
            if connection is None:  # the stack stopped it between handing it out and now
                return self._exited(process, request_id, time.time(), time.monotonic())
            return self._invoke(process, connection, request_id, event, on_call)
        finally:
            self._done_reading()

    def _invoke(
        self,
        process: subprocess.Popen[bytes],
        connection: Connection,
        request_id: str,
        event: Any,
        on_call: CallHandler,
    ) -> WorkerResult:
        sent_at, sent = time.time(), time.monotonic()
        deadline = sent + self.spec.timeout_seconds + RESULT_GRACE_SECONDS
        try:
            connection.send(Invoke(request_id, event))
            while (message := _receive(connection, deadline)) is not None:
                if isinstance(message, Call):
                    connection.send(self._answer(message, on_call))
                    continue
                if not isinstance(message, WorkerResult):
                    raise WorkerProtocolError(f"{self.function}: unexpected message {message!r}")
                return message
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
        except OSError:
            pass  # the connection broke or was closed (the stack stops): the worker is gone, as below
        return self._exited(process, request_id, sent_at, sent)

    def _exited(self, process: subprocess.Popen[bytes], request_id: str, sent_at: float, sent: float) -> WorkerResult:
        """The invocation's end when its worker went away (its end of the connection closed)."""
        self.stop(grace_seconds=1.0)  # a moment for its exit status, then it is killed
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

    def _answer(self, call: Call, on_call: CallHandler) -> Answer | CallFailed:
        try:
            return Answer(on_call(call.service, call.operation, call.params))
        except CallError as error:
            return CallFailed(error.code, error.message, error.status)
        except Exception as error:  # the worker's call fails as a 500 would; the stack keeps going
            log.exception("%s: a %s.%s call from its worker failed", self.function, call.service, call.operation)
            return CallFailed("ServiceException", str(error), 500)

    def close_input(self) -> None:
        """Tell the worker to end (its connection closes), without waiting for it; a busy one's
        connection is closed by the thread reading it, once the worker has gone."""
        self._stopped.set()
        reader = self._reader
        if reader is None or reader is threading.current_thread():
            self._close_connection()

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Close its connection (a worker ends then), then kill what is still there."""
        self.close_input()
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _done_reading(self) -> None:
        self._reader = None
        if self._stopped.is_set():
            self._close_connection()

    def _close_connection(self) -> None:
        # The reader and a stopping thread may both get here (each sees the other's flag).
        with self._closing:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _receive(connection: Connection, deadline: float) -> object | None:
    """The next message; None once the worker's end is closed; TimeoutError past `deadline`."""
    if not connection.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError
    try:
        message: object = connection.recv()
    except EOFError:
        return None
    return message


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
        output: IO[str] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one environment per function, not {size}")
        self.size = size
        self._environment = environment
        self._arn = arn
        self._on_call = on_call
        self._output = output
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
        there are fewer than `size`, or the first to come free."""
        with self._changed:
            while True:
                if self._closed:
                    raise RuntimeStoppedError("the Lambda runtime is stopped")
                slot = self._slots.setdefault(spec.name, _Slot())
                if slot.idle:
                    return slot.idle.pop()  # the most recently used, as Lambda prefers warm ones
                if slot.live < self.size:
                    slot.live += 1
                    env = ExecutionEnvironment(
                        spec, self._arn(spec.name), self._environment(spec), slot.generation, self._output
                    )
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
        """Stop every worker: idle ones as their connections close, busy ones killed now (their
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
