"""The storage of one column of the profile (`store.py`): as few bytes a value as give it back exactly.

- `Numbers`: floats, kept as 4-byte int32 counts of 10**-decimals (or float32) while that gives
  every value back exactly, else float64;
- `Runs`: labels that rarely change (rank, node, phase, epoch), run-length encoded;
- `GrowableArray`: the growable numpy array under both (and under the store's row numbers and
  timestamps).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_MIN_CAPACITY = 64


class GrowableArray:
    """A growable 1-D array: capacity grows by a quarter, so appending costs O(1) on average."""

    __slots__ = ("data", "size")

    def __init__(self, dtype: Any) -> None:
        self.data: np.ndarray[Any, Any] = np.empty(0, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray[Any, Any]) -> None:
        need = self.size + len(values)
        if need > len(self.data):
            grown = np.empty(max(need, len(self.data) * 5 // 4, _MIN_CAPACITY), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    def view(self) -> np.ndarray[Any, Any]:
        return self.data[: self.size]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class Numbers:
    """A column of floats: 4 bytes a value while that gives every value back exactly, else float64.

    The 4-byte form is int32 counts of 10**-decimals (numbers the writer rounded to `decimals`),
    or float32 when `decimals` is None. The first value it cannot give back exactly (never
    rounded, too large, NaN for int32) turns the column to float64: the storage changes nothing.
    """

    __slots__ = ("_array", "_scale")

    def __init__(self, decimals: int | None) -> None:
        self._scale = None if decimals is None else float(10**decimals)
        self._array = GrowableArray(np.float32 if decimals is None else np.int32)

    def _widen(self, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self._scale is None or raw.dtype == np.float64:
            return raw.astype(np.float64)
        return raw / self._scale  # correctly rounded, as the writer's round(): the float it wrote

    def extend(self, values: Sequence[float]) -> None:
        new = np.asarray(values, dtype=np.float64)
        if self._array.data.dtype != np.float64:
            with np.errstate(all="ignore"):  # a value out of range casts to garbage, caught below
                narrow = new.astype(np.float32) if self._scale is None else np.rint(new * self._scale).astype(np.int32)
            if np.array_equal(self._widen(narrow), new, equal_nan=True):
                self._array.extend(narrow)
                return
            widened = self.floats()
            self._array = GrowableArray(np.float64)
            self._array.extend(widened)
        self._array.extend(new)

    def floats(self, first: int = 0, end: int | None = None) -> np.ndarray[Any, Any]:
        """The values (of rows `first`..`end`), as the writer wrote them: a new float64 array."""
        return self._widen(self._array.view()[first:end])

    def whole(self, index: int) -> int | float:
        """One value of a column of whole numbers: an int, unless some value was not one."""
        raw = self._array.data[index]
        return int(raw) if self._scale == 1.0 and raw.dtype == np.int32 else float(self._widen(raw))

    @property
    def nbytes(self) -> int:
        return self._array.nbytes


class Runs:
    """A column of labels that rarely change (rank, node, phase, epoch): run-length encoded."""

    __slots__ = ("size", "starts", "values")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.values: list[Any] = []
        self.size = 0

    def extend(self, values: Iterable[Any]) -> None:
        for value in values:
            if not self.values or (self.values[-1] is not value and self.values[-1] != value):
                self.starts.append(self.size)
                self.values.append(value)
            self.size += 1

    def value(self, index: int) -> Any:
        return self.values[bisect.bisect_right(self.starts, index) - 1]

    def flags(self, first: int, end: int) -> np.ndarray[Any, Any]:
        """Rows `first`..`end` of a column of True and False, as booleans."""
        return np.repeat(np.array(self.values, dtype=bool), np.diff([*self.starts, self.size]))[first:end]

    @property
    def nbytes(self) -> int:
        return 16 * len(self.starts) + 112
