"""Check files in a child process that holds no AWS credentials and is killed at a time limit.

Pillow's C decoders cannot be interrupted from Python: a file built to be slow (a progressive
JPEG of thousands of scans, a few hundred kilobytes) holds the calling thread until it is done,
minutes later, and with it the intake's invocation, its batch and, redelivered, every batch after.
So the intake hands each file to a child process: the same `check_image` / `check_label`, run
there, and a child still busy at the limit is killed and the file rejected as `decode_too_slow`.

The child is a fresh interpreter (`subprocess`, not `fork`: a forked child would inherit the
parent's memory, its boto3 clients and their credentials), started with an environment of its own
that names no AWS variable at all (`CHILD_ENVIRONMENT`): no keys, no session token, no container
credentials endpoint, no Lambda runtime API. Should a file take Pillow over, the process it runs in
can sign no AWS request. It talks to the parent over two pipes only (no `multiprocessing.Queue`,
`Pool` or `Manager`: they need /dev/shm, which Lambda lacks), and answers in JSON that the parent
validates as a `FileCheck`, never pickle: a child taken over cannot make the parent run anything.

The child runs as the same Linux user, so the parent also makes itself non-dumpable
(`keep_from_children`): the kernel then hides its /proc files (environ, mem) from processes of that
user and refuses them ptrace, and a child taken over cannot read the credentials from the
parent's environment or memory instead.

One child serves every file of the process's life (a Lambda environment's invocations, warm
starts included): starting one costs a fresh interpreter's imports, a file costs one round trip
(benchmarks/bench_decoder_process.py). A child that was killed, or died, is replaced at the next
file. Its start is not counted against a file's limit: a slow start is the function's problem, and
one that fails raises `DecoderUnavailableError` (the record is retried, the file is not blamed).

`serve` below is the child's side (`CHILD_CODE`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import select
import struct
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, ValidationError

from functions.common.errors import RetrainError
from functions.validation.config import ValidationConfig
from functions.validation.images import check_image
from functions.validation.masks import check_label
from functions.validation.reasons import ReasonCode
from functions.validation.results import FileCheck, Reason, Role

# What the child's environment may hold, and nothing else: the interpreter must find its shared
# library (LD_LIBRARY_PATH on Lambda) and the code (PYTHONPATH, set from the parent's sys.path).
CHILD_ENVIRONMENT = ("PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# A fresh interpreter importing Pillow and pydantic; on a loaded machine, seconds.
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 5.0
# A FileCheck is a few hundred bytes (a mask's value counts: at most 256 entries); more is no answer.
MAX_ANSWER_BYTES = 1 << 20
# The child's program: `main` below (not `-m` this module, which the package has imported
# already, and which runpy would then run a second time as __main__).
CHILD_CODE = "from functions.validation.decoder_process import main; main()"
_READY = b"R"
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_REQUEST_HEADER = struct.Struct(">IQ")  # header JSON length, file length
_ANSWER_HEADER = struct.Struct(">I")
_CHUNK = 1 << 20

Checker = Callable[[bytes, str, ValidationConfig], FileCheck]
CHECKS: dict[Role, Checker] = {Role.IMAGE: check_image, Role.LABEL: check_label}
# How the intake checks one file: `check_in_process`, or a `DecoderProcess`.
FileChecker = Callable[[Role, bytes, str, ValidationConfig], FileCheck]


class DecoderUnavailableError(RetrainError):
    """The decoder's child process could not be started, or answered nonsense: a fault of the
    function, not of the file, so the record is retried (and, failing, reaches the DLQ)."""


class _Answer(BaseModel):
    """What the child sends back: the file's check, or the error a check raised there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: FileCheck | None = None
    error: str | None = None


class _StoppedError(Exception):
    """The child did not answer in time (`timed_out`), or ended before it answered."""

    def __init__(self, timed_out: bool, detail: str) -> None:
        super().__init__(detail)
        self.timed_out = timed_out


def check_in_process(role: Role, data: bytes, key: str, config: ValidationConfig) -> FileCheck:
    """The same check in the calling process: no limit (the CLI, on the user's own files)."""
    return CHECKS[role](data, key, config)


class DecoderProcess:
    """`check(role, data, key, config)`: the file's `FileCheck`, decided in the child within
    `limit_seconds` (round trip included), or `decode_too_slow`."""

    def __init__(self, limit_seconds: float) -> None:
        if limit_seconds <= 0:
            raise ValueError(f"the decode limit must be positive, not {limit_seconds}")
        self.limit_seconds = limit_seconds
        self._child: subprocess.Popen[bytes] | None = None
        self._stop = weakref.finalize(self, _stop, None)
        self.started = 0  # children started: one, unless files were too slow or crashed it

    @property
    def pid(self) -> int | None:
        """The child's process id, while one runs."""
        return None if self._child is None else self._child.pid

    def __call__(self, role: Role, data: bytes, key: str, config: ValidationConfig) -> FileCheck:
        return self.check(role, data, key, config)

    def check(self, role: Role, data: bytes, key: str, config: ValidationConfig) -> FileCheck:
        header = json.dumps({"role": role.value, "key": key, "config": config.model_dump(mode="json")}).encode()
        request = _REQUEST_HEADER.pack(len(header), len(data)) + header
        died = ""
        for _ in range(2):  # a child that dies on a file gets one more, fresh, before the file is blamed
            child = self._running()
            started = time.monotonic()
            try:
                answer = _exchange(child, request, data, started + self.limit_seconds)
            except _StoppedError as stopped:
                if stopped.timed_out:
                    message = self._too_slow(time.monotonic() - started)
                    self.close()
                    return _rejected(role, data, key, ReasonCode.DECODE_TOO_SLOW, message)
                died = f"{stopped}, {_how_it_ended(child)}"
                self.close()
                continue
            if answer.error is not None:
                # A check that raised in the child would have raised here: the record fails as before.
                raise DecoderUnavailableError(f"checking {key} failed in the decoder process: {answer.error}")
            if answer.check is None:
                raise DecoderUnavailableError(f"the decoder process answered no check for {key}")
            return answer.check
        return _rejected(
            role,
            data,
            key,
            ReasonCode.IMAGE_UNDECODABLE,
            f"the decoder process died twice while reading this file ({died}): a file that crashes the decoder",
        )

    def _too_slow(self, seconds: float) -> str:
        return (
            f"checking the file took longer than the limit of {self.limit_seconds:g} s: stopped after "
            f"{seconds:.1f} s (a progressive JPEG of many scans, or another file built to be "
            "slow to decode); re-export it as a baseline JPEG or a plain PNG"
        )

    def _running(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self.close()
        child = subprocess.Popen(  # noqa: S603 (our own interpreter and module, no shell)
            [sys.executable, "-c", CHILD_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_environment(),
        )
        self._stop = weakref.finalize(self, _stop, child)
        assert child.stdout is not None and child.stdin is not None
        os.set_blocking(child.stdin.fileno(), False)  # writes wait in select(), bounded by the limit
        try:
            ready = _read_exact(child.stdout.fileno(), len(_READY), time.monotonic() + START_TIMEOUT_SECONDS)
        except _StoppedError as stopped:
            self.close()
            raise DecoderUnavailableError(f"the decoder process did not start: {stopped}") from stopped
        if ready != _READY:
            self.close()
            raise DecoderUnavailableError(f"the decoder process started with {ready!r} instead of its ready byte")
        self._child, self.started = child, self.started + 1
        return child

    def close(self) -> None:
        """Stop the child (if any); the next file starts a new one."""
        self._stop()
        self._child = None


def keep_from_children() -> bool:
    """Make this process non-dumpable (Linux's prctl PR_SET_DUMPABLE 0): its /proc/<pid>/environ
    and mem become root's, and no process of its user may ptrace it, so a decoder child taken over
    reads none of its credentials. Also: no core dumps, and the process cannot read its own
    /proc/self/environ (nothing here does). Whether it now is; False where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return int(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)) == 0


def child_environment() -> dict[str, str]:
    """The child's whole environment: a few variables the interpreter needs, its import path, and no
    AWS_* variable (credentials, the container credentials endpoint) nor any other of the function's."""
    environment = {name: os.environ[name] for name in CHILD_ENVIRONMENT if name in os.environ}
    # sys.path's "" is the working directory, which the child need not share.
    environment["PYTHONPATH"] = os.pathsep.join(path or str(Path.cwd()) for path in sys.path)
    environment["PYTHONDONTWRITEBYTECODE"] = "1"  # Lambda's code directory is read-only
    return environment


def _stop(child: subprocess.Popen[bytes] | None) -> None:
    if child is None or child.poll() is not None:
        return
    child.kill()
    child.wait(STOP_TIMEOUT_SECONDS)
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()


def _how_it_ended(child: subprocess.Popen[bytes]) -> str:
    try:
        code = child.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _rejected(role: Role, data: bytes, key: str, code: ReasonCode, message: str) -> FileCheck:
    """A file the child could not judge: what the parent knows of it, and why it is rejected."""
    return FileCheck(
        key=key,
        role=role,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        reasons=(Reason(code=code, message=message, key=key),),
    )


def _exchange(child: subprocess.Popen[bytes], request: bytes, data: bytes, deadline: float) -> _Answer:
    assert child.stdin is not None and child.stdout is not None
    _write_all(child.stdin.fileno(), request, deadline)
    _write_all(child.stdin.fileno(), data, deadline)
    (length,) = _ANSWER_HEADER.unpack(_read_exact(child.stdout.fileno(), _ANSWER_HEADER.size, deadline))
    if length > MAX_ANSWER_BYTES:
        raise DecoderUnavailableError(f"the decoder process announced an answer of {length} bytes")
    body = _read_exact(child.stdout.fileno(), length, deadline)
    try:
        return _Answer.model_validate_json(body)
    except ValidationError as error:
        raise DecoderUnavailableError(f"the decoder process answered no FileCheck: {error}") from error


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        _wait(fd, deadline, write=True)
        try:
            written = os.write(fd, view[:_CHUNK])
        except BlockingIOError:
            continue
        except BrokenPipeError as error:
            raise _StoppedError(False, "it closed its input") from error
        view = view[written:]


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while size:
        _wait(fd, deadline, write=False)
        chunk = os.read(fd, min(size, _CHUNK))
        if not chunk:
            raise _StoppedError(False, "it ended without answering")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _StoppedError(True, "no answer in time")
    ready = select.select([], [fd], [], left) if write else select.select([fd], [], [], left)
    if not any(ready):
        raise _StoppedError(True, "no answer in time")


# ------------------------------------------------------------------ the child --
def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer requests until the parent closes the pipe: one file at a time, in this process."""
    answers.write(_READY)
    answers.flush()
    configs: dict[str, ValidationConfig] = {}
    while head := requests.read(_REQUEST_HEADER.size):
        header_length, data_length = _REQUEST_HEADER.unpack(head)
        request = json.loads(requests.read(header_length))
        data = requests.read(data_length)
        config_key = json.dumps(request["config"], sort_keys=True)
        config = configs.get(config_key) or configs.setdefault(
            config_key, ValidationConfig.model_validate(request["config"])
        )
        try:
            answer = _Answer(check=CHECKS[Role(request["role"])](data, request["key"], config))
        except Exception as error:  # the parent raises it by name, as an in-process check would
            answer = _Answer(error=f"{type(error).__name__}: {error}")
        body = answer.model_dump_json().encode()
        answers.write(_ANSWER_HEADER.pack(len(body)) + body)
        answers.flush()


def main() -> None:
    # The pipe to the parent is fd 1; anything printed (a library's warning) goes to stderr instead.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)
