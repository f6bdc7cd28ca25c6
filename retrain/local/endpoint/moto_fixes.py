"""Where moto 5.2.5 differs from AWS in ways our offline stack depends on, or is far slower than
it needs to be: each fix below says what moto does and what AWS does. `apply()` installs them
once, before the stack starts moto; every mode (in-process mock, threaded server) gets them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from importlib import reload
from types import ModuleType
from typing import Any

from moto import backends, settings
from moto.core.utils import unix_time
from moto.dynamodb.models.table import Table
from moto.s3.models import FakeKey, S3Backend
from moto.s3.utils import _VersionedKeyStore
from moto.sqs.models import Message, Queue, SQSBackend
from moto.stepfunctions.parser.api import ExecutionStatus
from moto.stepfunctions.parser.asl.eval.environment import Environment
from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped
from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication
from moto.stepfunctions.parser.backend.execution import Execution as EngineExecution
from moto.stepfunctions.responses import StepFunctionResponse

_applied = False
_s3_urls: tuple[tuple[str, ...], ModuleType] | None = None
_sending = threading.local()
_COUNTS = (
    "approximate_number_of_messages",
    "approximate_number_of_messages_delayed",
    "approximate_number_of_messages_not_visible",
)


def apply() -> None:
    """Install the fixes (idempotent)."""
    global _applied  # noqa: PLW0603 (a process-wide patch of moto's classes, done once)
    if _applied:
        return
    _applied = True
    SQSBackend.is_message_valid_based_on_retention_period = _retained  # type: ignore[method-assign]
    _moto_send_message = SQSBackend.send_message

    def send_message_without_counting(self: SQSBackend, *args: Any, **kwargs: Any) -> Message:
        """moto 5.2.5's SendMessage reads the queue's attributes for ContentBasedDeduplication;
        building them counts every message in the queue, so an upload of n objects costs n
        squared. Nothing in a send reads the counts: they are not made while it runs."""
        _sending.active = True
        try:
            return _moto_send_message(self, *args, **kwargs)
        finally:
            _sending.active = False

    SQSBackend.send_message = send_message_without_counting  # type: ignore[method-assign]
    for name in _COUNTS:
        setattr(Queue, name, property(_count_unless_sending(getattr(Queue, name))))
    S3Backend._url_module = property(_s3_url_module)  # type: ignore[assignment,method-assign]
    FakeKey.value = FakeKey.value.setter(_set_value_and_etag)  # type: ignore[attr-defined,method-assign]
    for name in ("items", "iteritems", "_iteritems"):
        setattr(_VersionedKeyStore, name, _present_items)
    for name in ("values", "itervalues", "_itervalues"):
        setattr(_VersionedKeyStore, name, _present_values)
    for name in ("lists", "iterlists", "_iterlists"):
        setattr(_VersionedKeyStore, name, _present_lists)
    Table.all_items = _all_items_of_a_snapshot  # type: ignore[method-assign]
    backends.list_of_moto_modules = functools.cache(_moto_modules)
    StepFunctionResponse.send_task_failure = _send_task_failure_with_its_cause  # type: ignore[method-assign]
    StepFunctionResponse.stop_execution = _stop_execution_with_its_error_and_cause  # type: ignore[method-assign]
    Environment.set_stop = _set_stop_and_wake_the_waiting_tasks  # type: ignore[method-assign]
    Environment.set_error = _set_error_unless_stopped  # type: ignore[method-assign]
    Environment.set_timed_out = _set_timed_out_unless_stopped  # type: ignore[method-assign]
    BaseExecutionWorkerCommunication._reflect_execution_status = _reflect_the_stop_s_error_and_cause  # type: ignore[method-assign]


_set_value = FakeKey.value.fset  # type: ignore[attr-defined]


def _set_value_and_etag(self: FakeKey, new_value: bytes) -> None:
    """moto 5.2.5 hashes an object's bytes for its ETag the first time the ETag is read, which for
    a PutObject is while writing its answer. If another PutObject of the same key replaced the
    object in between, moto has closed the first one's buffer ("I/O operation on closed file"): two
    writers of one key, which AWS serves both, fail one of them. The ETag is made with the bytes
    (unless given, as a multipart upload's is; moto never recomputes one either)."""
    _set_value(self, new_value)
    if self._etag is None:
        _ = self.etag


# moto 5.2.5's server answers requests on many threads, but its S3 and DynamoDB backends are
# plain dicts. A listing (ListObjectVersions, ListObjects) walks a bucket's keys taken at its
# start and then reads each, and a key deleted meanwhile (the intake deletes each upload after
# curating it) made it fail with a 500: TypeError "'NoneType' object is not iterable", or a
# KeyError. A DynamoDB Query or Scan walks the table's items while another request adds one:
# RuntimeError "dictionary changed size during iteration". AWS answers both. A key gone since the
# listing started is left out of it (as if listed a moment later); the table is read from a copy.
def _present_lists(self: _VersionedKeyStore) -> Iterator[tuple[str, list[Any]]]:
    for key in self._self_iterable():
        versions = self.getlist(key)
        if versions:
            yield key, versions


def _present_items(self: _VersionedKeyStore) -> Iterator[tuple[str, Any]]:
    for key, versions in _present_lists(self):
        yield key, versions[-1]


def _present_values(self: _VersionedKeyStore) -> Iterator[Any]:
    for _, latest in _present_items(self):
        yield latest


def _all_items_of_a_snapshot(self: Table) -> list[Any]:
    items: list[Any] = []
    for hash_set in list(self.items.values()):
        if self.range_key_attr:
            items.extend(list(hash_set.values()))
        else:
            items.append(hash_set)
    return sorted(items, key=lambda x: (x.hash_key, x.range_key) if x.range_key else x.hash_key)


def _retained(self: SQSBackend, queue_name: str, message: Message) -> bool:
    """moto 5.2.5 asks, for every message a ReceiveMessage looks at, for the queue's attributes to
    read its retention period; building them counts the queue's visible, delayed and in-flight
    messages, so one receive costs the square of the queue's depth (a 1,000-object upload: about a
    million timestamp checks per receive, most of the offline intake's time). Same rule, read
    from the queue: a message is kept until its retention period after it was sent."""
    queue = self.get_queue(queue_name)
    retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000  # type: ignore[attr-defined,operator]
    return bool(retain_until > unix_time())


def _count_unless_sending(count: property) -> Any:
    def counted(queue: Queue) -> int:
        return 0 if getattr(_sending, "active", False) else int(count.fget(queue))  # type: ignore[misc]

    return counted


def _s3_url_module(self: S3Backend) -> ModuleType:
    """moto 5.2.5 re-imports `moto.s3.urls` on every in-process S3 request (about half of each
    call's time here: a PutObject took 2.9 ms with it, 1.4 ms without) because its URL patterns
    read MOTO_S3_CUSTOM_ENDPOINTS. Reload only when that setting changed since the last one."""
    global _s3_urls  # noqa: PLW0603 (one module per process, as moto's own import)
    from moto.s3 import urls  # noqa: PLC0415

    endpoints = tuple(settings.get_s3_custom_endpoints())
    if _s3_urls is None or _s3_urls[0] != endpoints:
        _s3_urls = (endpoints, reload(urls))
    return _s3_urls[1]


_moto_modules_listed = backends.list_of_moto_modules


def _moto_modules() -> tuple[str, ...]:
    """moto's server lists its own package folder (about 150 `isdir` calls) on every request, under
    a lock every request thread takes; the installed package does not change while it runs."""
    return tuple(_moto_modules_listed())


def _send_task_failure_with_its_cause(self: StepFunctionResponse) -> Any:
    """moto 5.2.5's SendTaskFailure drops the request's `cause` before its engine sees it; AWS hands
    it to the state's Catch (`Cause`), and the run's message quotes it. Pass it through."""
    from moto.core.responses import EmptyResult  # noqa: PLC0415

    self.stepfunction_backend.send_task_failure(  # type: ignore[call-arg]
        self._get_param("taskToken"), error=self._get_param("error"), cause=self._get_param("cause")
    )
    return EmptyResult()


_moto_set_error = Environment.set_error
_moto_set_timed_out = Environment.set_timed_out


def _set_error_unless_stopped(self: Environment, error: Any) -> None:
    """moto 5.2.5 lets an error raised after StopExecution (a task waiting for its token wakes
    and fails) overwrite the stop, so the execution ends FAILED; on AWS a stopped execution is
    ABORTED, and RunEndedFunction tells the team it was stopped, not that it failed."""
    with self._state_mutex:
        if not isinstance(self._program_state, ProgramStopped):
            _moto_set_error(self, error)


def _set_timed_out_unless_stopped(self: Environment) -> None:
    """A stop stays a stop. And as for a stop (below), moto 5.2.5 leaves a `.waitForTaskToken`
    task with a heartbeat asleep after the execution timed out, its thread alive until the
    heartbeat runs out; on AWS the execution has ended. Wake the waiting tasks: they see it."""
    with self._state_mutex:
        if isinstance(self._program_state, ProgramStopped):
            return
        _moto_set_timed_out(self)
    _wake_the_waiting_tasks(self)


def _wake_the_waiting_tasks(env: Environment) -> None:
    for endpoint in list(env.callback_pool_manager._pool.values()):
        endpoint.interrupt_all()


_moto_set_stop = Environment.set_stop


def _set_stop_and_wake_the_waiting_tasks(
    self: Environment, stop_date: Any, cause: str | None, error: str | None
) -> None:
    """moto 5.2.5 leaves a `.waitForTaskToken` task with a heartbeat asleep after StopExecution
    until its token is answered or its heartbeat runs out (25 minutes here), and the execution
    stays RUNNING meanwhile; on AWS it is ABORTED at once. Wake the waiting tasks: they see the stop."""
    _moto_set_stop(self, stop_date=stop_date, cause=cause, error=error)
    _wake_the_waiting_tasks(self)


def _stop_execution_with_its_error_and_cause(self: StepFunctionResponse) -> Any:
    """moto 5.2.5's StopExecution drops the request's `error` and `cause` (it stops with empty
    ones); AWS keeps them on the execution, and RunEndedFunction quotes the cause to the team.

    And moto's engine says ABORTED only once the execution's program has ended, after the task it
    runs returns: until then DescribeExecution says RUNNING. AWS says ABORTED at once, while a
    Lambda function the execution was waiting for may still be running (and may ask: "Start
    training" does, to stop the job it has just created)."""
    from moto.core.responses import ActionResult  # noqa: PLC0415
    from moto.core.utils import utcnow  # noqa: PLC0415
    from moto.stepfunctions.exceptions import ExecutionDoesNotExist  # noqa: PLC0415

    arn = self._get_param("executionArn")
    backend = self.stepfunction_backend
    backend._validate_execution_arn(arn)
    machine = backend._get_state_machine_for_execution(arn)
    # The engine's executions (the parser backend's) are kept in the same list, typed as moto's own.
    execution: Any = next((x for x in machine.executions if x.execution_arn == arn), None)
    if execution is None:
        raise ExecutionDoesNotExist("Execution Does Not Exist: '" + arn + "'")
    stopped_at, error, cause = utcnow(), self._get_param("error"), self._get_param("cause")
    execution.stop(stop_date=stopped_at, error=error, cause=cause)
    if isinstance(execution, EngineExecution) and execution.exec_status == ExecutionStatus.RUNNING:
        # The engine's own reflection of the stop, when the program ends, says the same.
        execution.exec_status, execution.stop_date = ExecutionStatus.ABORTED, stopped_at
        execution.error, execution.cause = error or None, cause or None
    return ActionResult({"stopDate": execution.stop_date})


_moto_reflect_execution_status = BaseExecutionWorkerCommunication._reflect_execution_status


def _reflect_the_stop_s_error_and_cause(self: BaseExecutionWorkerCommunication) -> None:
    """moto 5.2.5 forgets StopExecution's `error` and `cause`; AWS's DescribeExecution (and the
    execution status change event) carry them, and the team's message quotes the cause."""
    _moto_reflect_execution_status(self)  # type: ignore[no-untyped-call]
    ended = self.execution.exec_worker.env.program_state()  # type: ignore[union-attr]
    if isinstance(ended, ProgramStopped):
        self.execution.error, self.execution.cause = ended.error or None, ended.cause or None
