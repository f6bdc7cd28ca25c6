"""Payloads that cross a boundary: S3 notifications, state-machine input and state outputs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from functions.common import prefixes

# StartExecution names: 1-80 characters, none of whitespace or <>{}[]?*"#%\^|~`$&,;:/ (the
# dataset version is the execution name, so it must be a valid one).
_EXECUTION_NAME = r"^[^\s<>{}\[\]?*\"#%\\^|~`$&,;:/]{1,80}$"
DatasetVersion = Annotated[str, StringConstraints(pattern=_EXECUTION_NAME)]


class S3ObjectEvent(BaseModel):
    """One object-created event, whatever emitted it (AWS, or moto with fewer fields)."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    key: str
    size: int = Field(ge=0)
    etag: str | None = None
    version_id: str | None = None
    event_name: str
    event_time: datetime | None = None

    @property
    def batch(self) -> str | None:
        return prefixes.batch_of(self.key)


def decode_key(raw: str) -> str:
    """S3 event keys are form-encoded: spaces arrive as `+`, `+` as `%2B`, moto also encodes `/`."""
    return unquote_plus(raw)


class RunInput(BaseModel):
    """What starts a retraining run: one frozen dataset version."""

    model_config = ConfigDict(extra="ignore")

    dataset_version: DatasetVersion


class RunContext(BaseModel):
    """What every later state knows about the run."""

    dataset_version: DatasetVersion
    manifest_uri: str
    manifest_version_id: str | None
    pair_count: int = Field(ge=0)
