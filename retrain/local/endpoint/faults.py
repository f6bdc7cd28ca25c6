"""Faults injected where the call really stops: S3 and DynamoDB writes throttled in moto's backends.

Why the backend, and not botocore's hooks: botocore calls every `before-send` handler and uses the
first answer, and moto's own stubber is one of those handlers, so a throttling error answered
from a hook still lets moto execute the request behind it. For a read that changes nothing; for a
write it means the object or item was written although the caller was told it was not, which AWS
never does. (In server mode a worker process's request does not pass this process's hooks at
all.) Every write, in both modes, ends in the same place: `mock_aws`'s stubber and the loopback
server's app (the stack's process) both call the methods of moto's S3 and DynamoDB backends. A
throttle raised at the entry of such a method comes before anything is written, and reaches the
client as the service sends it (S3: HTTP 503 `SlowDown` in XML; DynamoDB: HTTP 400
`ProvisionedThroughputExceededException` or `ThrottlingException` in JSON), so botocore's
retries, and the SQS redelivery behind them, behave as they do on AWS.

`WriteThrottler` refuses the first `times` calls of an operation for each key that matches:

    with WriteThrottler(Throttle("dynamodb.PutItem", times=1), Throttle("s3.CopyObject", times=1)):
        ...  # every item's first PutItem and every object's first CopyObject are throttled

A key is the S3 object key (for CopyObject the destination; DeleteObjects is refused as a whole if
any of its keys still has throttles left), or the DynamoDB item's key values joined by a space
(`batch#x file#...` in the ledger). moto's own internal calls (CopyObject writes through
`put_object`, DeleteObjects deletes through `delete_object`, a transaction through `put_item`)
are part of the request that made them: only the outermost write of a thread counts.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from moto.dynamodb.models import DynamoDBBackend
from moto.s3.models import S3Backend
from werkzeug.exceptions import HTTPException

from functions.common.errors import RetrainError

Subjects = Callable[[Any, tuple[Any, ...], dict[str, Any]], list[str]]


class FaultInjectionError(RetrainError):
    """A throttle that cannot be installed: an unknown operation, or one installed already."""


class S3Throttled(HTTPException):
    """S3's answer to too many requests: 503 `SlowDown`, in S3's XML error body."""

    code = 503

    def __init__(self, error_code: str = "SlowDown", message: str = "Please reduce your request rate.") -> None:
        # The body is the description: moto answers a handler's HTTPException with it.
        super().__init__(
            description='<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(error_code)}</Code><Message>{escape(message)}</Message>"
            f"<RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId></Error>"
        )
        self.error_code = error_code

    def get_headers(self, *_: Any, **__: Any) -> list[tuple[str, str]]:
        return [("Content-Type", "application/xml")]

    def get_body(self, *_: Any, **__: Any) -> str:
        return str(self.description)


class DynamoDbThrottled(HTTPException):
    """DynamoDB's answer to too many requests: 400 with the error's type, in its JSON error body."""

    code = 400

    def __init__(
        self,
        error_code: str = "ProvisionedThroughputExceededException",
        message: str = "The level of configured provisioned throughput for the table was exceeded.",
    ) -> None:
        super().__init__(
            description=json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{error_code}", "message": message})
        )
        self.error_code = error_code

    def get_headers(self, *_: Any, **__: Any) -> list[tuple[str, str]]:
        return [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-ErrorType", self.error_code)]

    def get_body(self, *_: Any, **__: Any) -> str:
        return str(self.description)


# ---------------------------------------------------- what each write is about --
def _s3_key(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    return [str(kwargs.get("key_name", args[1] if len(args) > 1 else ""))]


def _s3_copy(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    return [str(kwargs.get("dest_key_name", args[2] if len(args) > 2 else ""))]


def _s3_delete_objects(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    objects = kwargs.get("objects", args[1] if len(args) > 1 else [])
    return [str(item["Key"]) for item in objects]


def _item_key(backend: Any, table_name: str, attributes: dict[str, Any]) -> str:
    """The item's key values, hash then range, joined by a space (`batch#x file#...`)."""
    table = backend.get_table(table_name)
    names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
    values = []
    for name in names:
        typed = attributes.get(name) or {}
        values.append(str(next(iter(typed.values()), "")) if isinstance(typed, dict) else str(typed))
    return " ".join(values)


def _dynamodb_put(backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    table = kwargs.get("table_name", args[0] if args else "")
    return [_item_key(backend, table, kwargs.get("item_attrs", args[1] if len(args) > 1 else {}))]


def _dynamodb_keyed(backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    table = kwargs.get("table_name", args[0] if args else "")
    return [_item_key(backend, table, kwargs.get("key", args[1] if len(args) > 1 else {}))]


@dataclass(frozen=True)
class _Target:
    backend: type[Any]
    method: str
    subjects: Subjects
    throttled: Callable[[str], HTTPException]


TARGETS: dict[str, _Target] = {
    "s3.PutObject": _Target(S3Backend, "put_object", _s3_key, S3Throttled),
    "s3.CopyObject": _Target(S3Backend, "copy_object", _s3_copy, S3Throttled),
    "s3.DeleteObject": _Target(S3Backend, "delete_object", _s3_key, S3Throttled),
    "s3.DeleteObjects": _Target(S3Backend, "delete_objects", _s3_delete_objects, S3Throttled),
    "dynamodb.PutItem": _Target(DynamoDBBackend, "put_item", _dynamodb_put, DynamoDbThrottled),
    "dynamodb.UpdateItem": _Target(DynamoDBBackend, "update_item", _dynamodb_keyed, DynamoDbThrottled),
    "dynamodb.DeleteItem": _Target(DynamoDBBackend, "delete_item", _dynamodb_keyed, DynamoDbThrottled),
}
# moto's backend methods that write through the ones above: what they write is part of their own
# request (a multipart upload's object, a transaction's items, an access-log line), never throttled
# as a request of its own.
OUTER: tuple[tuple[type[Any], str], ...] = (
    (S3Backend, "complete_multipart_upload"),
    (S3Backend, "log_incoming_request"),
    (DynamoDBBackend, "transact_write_items"),
)
DEFAULT_CODES = {"s3": "SlowDown", "dynamodb": "ProvisionedThroughputExceededException"}


def _every_key(_: str) -> bool:
    return True


@dataclass(frozen=True)
class Throttle:
    """Refuse the first `times` calls of `operation` (`s3.CopyObject`) for each key `keys` accepts,
    with the service's throttling error (`code`; by default S3's `SlowDown`, DynamoDB's
    `ProvisionedThroughputExceededException`)."""

    operation: str
    times: int
    keys: Callable[[str], bool] = _every_key
    code: str | None = None

    def __post_init__(self) -> None:
        if self.operation not in TARGETS:
            raise FaultInjectionError(f"cannot throttle {self.operation}: one of {', '.join(sorted(TARGETS))}")
        if self.times < 0:
            raise FaultInjectionError(f"a throttle refuses a call 0 or more times, not {self.times}")

    @property
    def error_code(self) -> str:
        return self.code or DEFAULT_CODES[self.operation.partition(".")[0]]


class WriteThrottler:
    """Throttles writes inside moto's backends while installed (a context manager)."""

    def __init__(self, *throttles: Throttle) -> None:
        self.throttles = throttles
        # Calls refused, per operation, and in order as (operation, key): what a test asserts on.
        self.throttled: Counter[str] = Counter()
        self.refused: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._originals: dict[tuple[type[Any], str], Any] = {}

    def install(self) -> WriteThrottler:
        # Every write method is wrapped, throttled or not, so that the outermost call is known.
        methods: list[tuple[type[Any], str, str | None]] = [
            (target.backend, target.method, operation) for operation, target in TARGETS.items()
        ]
        methods += [(backend, method, None) for backend, method in OUTER]
        for backend, method, operation in methods:
            current = getattr(backend, method)
            if getattr(current, "_throttler", None) is not None:
                self.uninstall()
                raise FaultInjectionError("moto's writes are throttled already: uninstall the other throttler first")
            self._originals[(backend, method)] = current
            setattr(backend, method, self._wrap(operation, current))
        return self

    def uninstall(self) -> None:
        for (backend, method), original in self._originals.items():
            setattr(backend, method, original)
        self._originals.clear()

    def __enter__(self) -> WriteThrottler:
        return self.install()

    def __exit__(self, *_: object) -> None:
        self.uninstall()

    def refusals(self, operation: str, key: str) -> int:
        """How often `operation` on `key` was refused so far."""
        with self._lock:
            return self.refused.count((operation, key))

    def _wrap(self, operation: str | None, original: Callable[..., Any]) -> Callable[..., Any]:
        target = TARGETS[operation] if operation is not None else None
        throttler = self

        def throttled(backend: Any, *args: Any, **kwargs: Any) -> Any:
            with _outermost() as outermost:
                if outermost and target is not None and operation is not None:
                    error = throttler._verdict(operation, target.subjects(backend, args, kwargs))
                    if error is not None:
                        raise target.throttled(error)
                return original(backend, *args, **kwargs)

        throttled._throttler = self  # type: ignore[attr-defined]
        return throttled

    def _verdict(self, operation: str, keys: list[str]) -> str | None:
        """The error code to refuse this call with, or None to let it through."""
        for throttle in self.throttles:
            if throttle.operation != operation:
                continue
            matching = [key for key in keys if throttle.keys(key)]
            with self._lock:
                # Every call of a key is refused until it was `times` times: refusals count calls.
                if not any(self.refused.count((operation, key)) < throttle.times for key in matching):
                    continue
                self.refused += [(operation, key) for key in matching]
                self.throttled[operation] += 1
            return throttle.error_code
        return None


_depth = threading.local()


@contextmanager
def _outermost() -> Iterator[bool]:
    """True for the outermost throttled method on this thread's stack (moto calls its own)."""
    level = getattr(_depth, "level", 0)
    _depth.level = level + 1
    try:
        yield level == 0
    finally:
        _depth.level = level
