"""Where `retrain local up` says it is, so commands in other terminals find it without flags.

The running stack writes one small JSON file (its endpoint, region, name and outputs, and its
process id) and removes it when it stops. A file left by a stack that was killed names a process
that is gone: readers treat it as no stack and say so. `RETRAIN_STATE_DIR` moves the file (tests
do, so they never see the stack a person has running).
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

STATE_FILE = "local-stack.json"


class LocalStackRecord(BaseModel):
    stack_name: str
    region: str
    endpoint_url: str
    outputs: dict[str, str]
    pid: int
    started_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def state_path() -> Path:
    configured = os.environ.get("RETRAIN_STATE_DIR")
    base = Path(configured) if configured else Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    return (base if configured else base / "retrain") / STATE_FILE


def publish(record: LocalStackRecord) -> Path:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(record.model_dump_json(indent=2))
    partial.replace(path)  # whole or not at all: a reader never sees half a record
    return path


def withdraw(pid: int | None = None) -> None:
    """Remove the record if it is this process's (a newer stack's record stays)."""
    path = state_path()
    record = _read(path)
    if record is not None and record.pid != (pid or os.getpid()):
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class StaleRecord(BaseModel):
    path: Path
    pid: int


def find() -> LocalStackRecord | StaleRecord | None:
    """The running offline stack; a stale record (its process is gone); or None."""
    path = state_path()
    record = _read(path)
    if record is None:
        return None
    if not _alive(record.pid):
        return StaleRecord(path=path, pid=record.pid)
    return record


def _read(path: Path) -> LocalStackRecord | None:
    try:
        return LocalStackRecord.model_validate_json(path.read_text())
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True
