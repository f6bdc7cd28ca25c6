"""Payloads that cross a boundary: S3 notifications, state-machine input and state outputs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self
from urllib.parse import unquote_plus

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from functions.common import prefixes
from functions.common.errors import InvalidEventError

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


class TriggerInput(BaseModel):
    """What the trigger is invoked with, from any of its three callers.

    - its schedule (EventBridge: `{"source": "aws.events", "detail-type": ...}`) and a kick after
      batches close (`{"source": "batch closed", "time": ...}`): look for data ready to train on;
    - the state machine's last state (`{"action": "release", "holder": <execution name>}`):
      release that run's lock first, then look (data that came during the run starts the next).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    action: Literal["look", "release"] = "look"
    holder: DatasetVersion | None = None
    source: str = "unknown"

    @model_validator(mode="after")
    def _release_names_its_holder(self) -> Self:
        if self.action == "release" and self.holder is None:
            raise ValueError("a release must name the holder (the execution) whose lock it frees")
        return self

    @classmethod
    def parse(cls, event: Any) -> TriggerInput:
        try:
            return cls.model_validate(event)
        except ValidationError as exc:
            raise InvalidEventError(
                f"the trigger's input is not a schedule, kick or release: "
                f"{exc.errors(include_url=False, include_context=False)}"
            ) from exc
