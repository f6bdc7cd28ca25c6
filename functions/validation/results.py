"""What validation says about each file and each pair: the models the ledger, the batch report
and the CLI's `--json` lines are made of."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from functions.validation.reasons import ReasonCode, RejectedError


def _printable(text: str) -> str:
    # A local file name that is not UTF-8 reaches us with lone surrogates, which no JSON
    # encoder accepts; show their bytes instead of failing the whole report.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


Text = Annotated[str, AfterValidator(_printable)]


class Status(StrEnum):
    VALID = "valid"
    INVALID = "invalid"
    INCOMPLETE = "incomplete"
    DUPLICATE = "duplicate"


class Role(StrEnum):
    IMAGE = "image"
    LABEL = "label"


class Reason(BaseModel):
    """One defect: a stable code, a message naming the offending values, and the file's key
    (None when the defect belongs to the pair, not to one file)."""

    model_config = ConfigDict(frozen=True)

    code: ReasonCode
    message: Text
    key: Text | None = None

    @classmethod
    def from_error(cls, error: RejectedError, key: str | None) -> Reason:
        return cls(code=error.code, message=error.message, key=key)


class FileCheck(BaseModel):
    """One file, checked on its own (the intake Lambda checks each object as it lands and keeps
    this in the ledger until its partner arrives)."""

    model_config = ConfigDict(frozen=True)

    key: Text
    role: Role
    size_bytes: int
    sha256: str | None = None
    format: str | None = None
    mode: str | None = None
    width: int | None = None
    height: int | None = None
    # Labels only: pixel count per class id (and the ignore value), zero counts left out.
    value_pixels: dict[int, int] | None = None
    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons


class PairResult(BaseModel):
    """The verdict on one item: an image/label pair, a lone file, or a manifest line."""

    model_config = ConfigDict(frozen=True)

    item: Text
    image: Text | None
    label: Text | None
    status: Status
    reasons: tuple[Reason, ...] = ()
    image_sha256: str | None = None
    label_sha256: str | None = None
    width: int | None = None
    height: int | None = None
    # Valid and duplicate pairs: pixels per taxonomy class name (zero counts left out).
    class_pixels: dict[str, int] | None = None
    ignore_pixels: int | None = None
    duplicate_of: Text | None = None
