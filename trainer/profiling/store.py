"""The profile held compactly and read incrementally: what rank 0's online rule evaluation keeps.

`ProfileStore(profile_dir).refresh()` parses only what was appended to `profile/system/*.jsonl`
and `profile/steps/rank*.jsonl` since its previous call (`jsonl.JsonlTail`: remembered offsets;
a line still being written waits for the next call) and appends it to columns. No record is
kept as a dict:

- **system samples**, per file: one float64 timestamp per snapshot (the records of one sample
  share it), and per series (node, type, name, dimension) its values as integers of 1/1000
  (the sampler rounds to 3 decimals): int32 while they fit and give every value back exactly,
  else int64, else float64. A series present in every snapshot (all of them, as the sampler
  writes) stores no row numbers; one with gaps stores an int32 row per value.
- **steps**, per rank file: `step` and `start`, `duration`, `data_wait`, `compute`,
  `communication` as integers of 1/10**6 (the writer rounds to 6 decimals; same promotion),
  `loss` as float32 while exact (a float32 tensor's `.item()`) else float64, and run-length
  encoded `rank`, `node`, `phase`, `epoch` (they change at epoch and phase boundaries only).
  A step line without `step`, `start` or `duration` is skipped; a missing `data_wait`,
  `compute` or `communication` reads 0 (the trainer always writes all three).

The bound: 4 bytes per sampled percentage, 8 per byte-rate value, 8 per snapshot, about 32
per step, plus at most a quarter more for the arrays' spare capacity. A host with 96 cores and 8
GPUs sampled every 500 ms (121 records a snapshot) and 8 ranks at 4 steps a second hold about
8 MB per hour of job; the dicts `read_jsonl` returns hold about 940 bytes per record
(`benchmarks/bench_profiler.py` measures both).

`SystemColumns` and `StepColumns` are sequences of records too (dicts made on the fly, and for
steps `StepView`, a read-only mapping onto one row), so any code that iterates a profile reads
them unchanged; the rules and the report use their column methods (`series`, `snapshots`, ...),
which give the very numbers the dicts would, without making one object per record.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from trainer.profiling.jsonl import JsonlTail

Record = dict[str, Any]
SeriesKey = tuple[str, Any, str, str]  # (node, type, name, dimension)
SYSTEM_DECIMALS, STEP_DECIMALS = 3, 6
_MIN_CAPACITY = 64
_INT32_LIMIT, _EXACT_LIMIT = 2**31, 2**53
ABSENT: Any = object()  # a key the record did not have


class _Array:
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

    def replace(self, values: np.ndarray[Any, Any]) -> None:
        self.data, self.size = values, len(values)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class Decimals:
    """Numbers written with at most `decimals` decimals, held as integers of 10**-decimals.

    int32 while every value fits and comes back exactly (`k / 10**decimals` is the float the
    writer rounded to), then int64, then float64 for values that do not (never rounded, or too
    large to be exact): nothing is ever changed by the storage.
    """

    __slots__ = ("_array", "_scale")

    def __init__(self, decimals: int) -> None:
        self._scale = float(10**decimals)
        self._array = _Array(np.int32)

    def __len__(self) -> int:
        return self._array.size

    @property
    def integral(self) -> bool:
        return bool(self._array.data.dtype != np.float64)

    def extend(self, values: Sequence[float]) -> None:
        new = np.asarray(values, dtype=np.float64)
        if self.integral and len(new):
            with np.errstate(all="ignore"):
                scaled = np.rint(new * self._scale)
                exact = bool(np.all(np.abs(scaled) < _EXACT_LIMIT) and np.all(scaled / self._scale == new))
            if exact:
                if self._array.data.dtype == np.int32 and np.abs(scaled).max() >= _INT32_LIMIT:
                    self._array.replace(self._array.view().astype(np.int64))
                self._array.extend(scaled.astype(self._array.data.dtype))
                return
            self._array.replace(self.floats())
        self._array.extend(new)

    def floats(self, first: int = 0, end: int | None = None) -> np.ndarray[Any, Any]:
        """The values (of rows `first`..`end`), as the writer wrote them: a new float64 array."""
        raw = self._array.view()[first:end]
        return raw / self._scale if self.integral else raw.astype(np.float64)

    def value(self, index: int) -> float:
        raw = self._array.data[index]
        # int / float in Python is correctly rounded, as numpy's division above: the same float.
        return int(raw) / self._scale if self.integral else float(raw)

    def whole(self, index: int) -> int | float:
        """One value of a column of whole numbers: an int, unless some value was not whole."""
        raw = self._array.data[index]
        return int(raw) if self.integral and self._scale == 1.0 else self.value(index)

    @property
    def nbytes(self) -> int:
        return self._array.nbytes


class Floats:
    """Floats (NaN for none), held as float32 while every value is exactly a float32, else float64."""

    __slots__ = ("_array",)

    def __init__(self) -> None:
        self._array = _Array(np.float32)

    def extend(self, values: Sequence[float]) -> None:
        new = np.asarray(values, dtype=np.float64)
        if self._array.data.dtype == np.float32:
            with np.errstate(all="ignore"):
                small = new.astype(np.float32)
            if np.array_equal(small.astype(np.float64), new, equal_nan=True):
                self._array.extend(small)
                return
            self._array.replace(self._array.view().astype(np.float64))
        self._array.extend(new)

    def value(self, index: int) -> float:
        return float(self._array.data[index])

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

    @property
    def nbytes(self) -> int:
        return 16 * len(self.starts) + 112


# --- system samples ----------------------------------------------------------------------------


class Series:
    """One metric of one host: its snapshot rows (implicit while it has one in every row) and values."""

    __slots__ = ("count", "first", "key", "rows", "values")

    def __init__(self, key: SeriesKey) -> None:
        self.key = key
        self.first = -1
        self.count = 0
        self.rows: _Array | None = None  # None: the rows first, first + 1, ..., first + count - 1
        self.values = Decimals(SYSTEM_DECIMALS)

    def extend(self, rows: list[int], values: list[float]) -> None:
        if self.rows is None:
            if not self.count:
                self.first = rows[0]
            start = self.first + self.count
            if rows[0] == start and rows[-1] == start + len(rows) - 1 and _consecutive(rows):
                self.count += len(rows)
                self.values.extend(values)
                return
            self.rows = _Array(np.int32)
            self.rows.extend(self.row_numbers())
        self.rows.extend(np.asarray(rows, dtype=np.int32))
        self.count += len(rows)
        self.values.extend(values)

    def row_numbers(self) -> np.ndarray[Any, Any]:
        if self.rows is not None:
            return self.rows.view()
        return np.arange(self.first, self.first + self.count, dtype=np.int64)

    def stamps(self, table: SystemTable) -> np.ndarray[Any, Any]:
        """The timestamp of each value (a view of the table's, while the rows are implicit)."""
        stamps: np.ndarray[Any, Any] = table.stamps.view()
        return stamps[self.first : self.first + self.count] if self.rows is None else stamps[self.rows.view()]

    def positions(self, row: int) -> range:
        """Which of this series' values sit in snapshot row `row`."""
        if self.rows is None:
            index = row - self.first
            return range(index, index + 1) if 0 <= index < self.count else range(0)
        rows = self.rows.view()
        return range(int(np.searchsorted(rows, row, "left")), int(np.searchsorted(rows, row, "right")))

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (self.rows.nbytes if self.rows is not None else 0) + 120


def _consecutive(rows: list[int]) -> bool:
    return all(b - a == 1 for a, b in itertools.pairwise(rows))


class SystemTable:
    """One system file's records: snapshot timestamps and the series, in the order first seen."""

    def __init__(self) -> None:
        self.stamps = _Array(np.float64)
        self.series: dict[SeriesKey, Series] = {}
        self.records = 0
        self.skipped = 0
        self._last = float("nan")

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        pending: dict[SeriesKey, tuple[list[int], list[float]]] = {}
        stamps: list[float] = []
        row = self.stamps.size - 1
        last = self._last
        for record in records:
            try:
                stamp, value = float(record["Timestamp"]), float(record["Value"])
                key = (str(record["NodeId"]), record.get("Type"), str(record["Name"]), str(record["Dimension"]))
            except (KeyError, TypeError, ValueError):
                self.skipped += 1
                continue
            if stamp != last:
                stamps.append(stamp)
                row += 1
                last = stamp
            entry = pending.get(key)
            if entry is None:
                entry = pending[key] = ([], [])
            entry[0].append(row)
            entry[1].append(value)
        self._last = last
        self.stamps.extend(np.asarray(stamps, dtype=np.float64))
        for key, (rows, values) in pending.items():
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = Series(key)
            series.extend(rows, values)
            self.records += len(rows)

    def iter_records(self, rows: Iterable[int] | None = None, node: str | None = None) -> Iterator[Record]:
        """Records as dicts in file order (snapshot by snapshot), of one node if given."""
        chosen = [s for s in self.series.values() if node is None or s.key[0] == node]
        stamps = self.stamps.view()
        for row in range(self.stamps.size) if rows is None else rows:
            stamp = float(stamps[row])
            for series in chosen:
                for index in series.positions(row):
                    node_id, kind, name, dimension = series.key
                    yield {
                        "Type": kind,
                        "Name": name,
                        "Dimension": dimension,
                        "Value": series.values.value(index),
                        "NodeId": node_id,
                        "Timestamp": stamp,
                    }

    @property
    def nbytes(self) -> int:
        return self.stamps.nbytes + sum(series.nbytes for series in self.series.values())


class SnapshotRecords(Sequence[Record]):
    """The records of one snapshot, made when iterated (a snapshot is one or a few table rows)."""

    __slots__ = ("_node", "_rows")

    def __init__(self, node: str, rows: list[tuple[SystemTable, int]]) -> None:
        self._node, self._rows = node, rows

    def __iter__(self) -> Iterator[Record]:
        for table, row in self._rows:
            yield from table.iter_records((row,), self._node)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        return list(self)[index]


class SystemColumns(Sequence[Record]):
    """Every host's system records, file by file (in file-name order, as `read_system` reads)."""

    def __init__(self) -> None:
        self.tables: dict[str, SystemTable] = {}

    def _ordered(self) -> list[SystemTable]:
        return [self.tables[name] for name in sorted(self.tables)]

    def __len__(self) -> int:
        return sum(table.records for table in self.tables.values())

    def __iter__(self) -> Iterator[Record]:
        for table in self._ordered():
            yield from table.iter_records()

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        return list(self)[index]  # for completeness: nothing here reads records by position

    @property
    def nbytes(self) -> int:
        return sum(table.nbytes for table in self.tables.values())

    def _of(self, dimension: str | None = None) -> Iterator[tuple[SystemTable, Series]]:
        for table in self._ordered():
            for series in table.series.values():
                if series.count and (dimension is None or series.key[3] == dimension):
                    yield table, series

    def has(self, dimension: str) -> bool:
        return any(True for _ in self._of(dimension))

    def series(self, dimension: str) -> dict[tuple[str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """(node, name) -> (timestamps, values), sorted by time then value: as `rules._series`."""
        parts: dict[tuple[str, str], list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]] = defaultdict(list)
        for table, series in self._of(dimension):
            parts[(series.key[0], series.key[2])].append((series.stamps(table), series.values.floats()))
        result = {}
        for key in sorted(parts):
            pieces = parts[key]
            stamps = pieces[0][0] if len(pieces) == 1 else np.concatenate([s for s, _ in pieces])
            values = pieces[0][1] if len(pieces) == 1 else np.concatenate([v for _, v in pieces])
            if len(stamps) > 1 and not bool(np.all(np.diff(stamps) > 0)):
                order = np.lexsort((values, stamps))
                stamps, values = stamps[order], values[order]
            result[key] = (stamps, values)
        return result

    def values(self) -> dict[tuple[str, str], np.ndarray[Any, Any]]:
        """(node, dimension) -> every value, sorted by key (the order within is the series')."""
        parts: dict[tuple[str, str], list[Series]] = defaultdict(list)
        for _, series in self._of():
            parts[(series.key[0], series.key[3])].append(series)
        result = {}
        for key in sorted(parts):
            values = np.empty(sum(series.count for series in parts[key]))
            at = 0
            for series in parts[key]:
                values[at : at + series.count] = series.values.floats()
                at += series.count
            result[key] = values
        return result

    def names(self, dimension: str) -> dict[str, set[str]]:
        """node -> the names (cores, GPUs) that have records of `dimension`."""
        names: dict[str, set[str]] = defaultdict(set)
        for _, series in self._of(dimension):
            names[series.key[0]].add(series.key[2])
        return dict(names)

    def nodes(self) -> set[str]:
        return {series.key[0] for _, series in self._of()}

    def time_range(self) -> tuple[float, float] | None:
        """The first and last timestamp of any record."""
        ranges = []
        for table in self.tables.values():
            if table.records:
                stamps = table.stamps.view()
                ranges.append((float(stamps.min()), float(stamps.max())))
        if not ranges:
            return None
        return min(r[0] for r in ranges), max(r[1] for r in ranges)

    def snapshots(self) -> dict[str, list[tuple[float, Sequence[Mapping[str, Any]]]]]:
        """Per node: its records in snapshots, grouped exactly as `rules._snapshots` groups them
        (sorted by time, a gap of more than `window` seconds from a snapshot's first record
        starts the next); each snapshot's records are made only when it is iterated."""
        from trainer.profiling.rules import SNAPSHOT_WINDOW_SECONDS  # noqa: PLC0415 - rules imports us

        result: dict[str, list[tuple[float, Sequence[Mapping[str, Any]]]]] = {}
        for node in sorted(self.nodes()):
            tables = [t for t in self._ordered() if any(s.key[0] == node and s.count for s in t.series.values())]
            stamps_parts, row_parts, table_parts = [], [], []
            for index, table in enumerate(tables):
                mask = np.zeros(table.stamps.size, dtype=bool)
                for series in table.series.values():
                    if series.key[0] == node:
                        mask[series.row_numbers()] = True
                rows = np.flatnonzero(mask)
                stamps_parts.append(table.stamps.view()[rows])
                row_parts.append(rows)
                table_parts.append(np.full(len(rows), index))
            stamps = np.concatenate(stamps_parts)
            order = np.argsort(stamps, kind="stable")
            rows_all, tables_all = np.concatenate(row_parts)[order], np.concatenate(table_parts)[order]
            groups: list[tuple[float, Sequence[Mapping[str, Any]]]] = []
            members: list[tuple[SystemTable, int]] = []
            first = 0.0
            for stamp, row, table_index in zip(
                stamps[order].tolist(), rows_all.tolist(), tables_all.tolist(), strict=True
            ):
                if members and stamp - first <= SNAPSHOT_WINDOW_SECONDS:
                    members.append((tables[table_index], row))
                    continue
                if members:
                    groups.append((first, SnapshotRecords(node, members)))
                first, members = stamp, [(tables[table_index], row)]
            if members:
                groups.append((first, SnapshotRecords(node, members)))
            result[node] = groups
        return result

    def per_snapshot(self, dimensions: Sequence[str]) -> dict[str, SnapshotStats]:
        """Per node, per snapshot (grouped as `snapshots`): min, max, sum and count of each dimension."""
        from trainer.profiling.rules import SNAPSHOT_WINDOW_SECONDS  # noqa: PLC0415 - rules imports us

        result: dict[str, SnapshotStats] = {}
        for node in sorted(self.nodes()):
            tables = [t for t in self._ordered() if any(s.key[0] == node and s.count for s in t.series.values())]
            # Every (table, row) of this node, in time order: the snapshot each one falls in.
            offsets, stamps_parts, row_parts = [], [], []
            total = 0
            for table in tables:
                mask = np.zeros(table.stamps.size, dtype=bool)
                for series in table.series.values():
                    if series.key[0] == node:
                        mask[series.row_numbers()] = True
                rows = np.flatnonzero(mask)
                offsets.append(total)
                total += table.stamps.size
                stamps_parts.append(table.stamps.view()[rows])
                row_parts.append(rows + offsets[-1])
            stamps = np.concatenate(stamps_parts)
            order = np.argsort(stamps, kind="stable")
            in_order = stamps[order]
            if bool(np.all(np.diff(in_order) > SNAPSHOT_WINDOW_SECONDS)):
                # A sampler's snapshots are an interval apart (100 ms at least): one row each.
                firsts, group_of_sorted = in_order.tolist(), np.arange(len(in_order))
            else:
                group_of_sorted = np.empty(len(in_order), dtype=np.int64)
                firsts = []
                for index, stamp in enumerate(in_order.tolist()):
                    if not firsts or stamp - firsts[-1] > SNAPSHOT_WINDOW_SECONDS:
                        firsts.append(stamp)
                    group_of_sorted[index] = len(firsts) - 1
            group_of_row = np.full(total, -1, dtype=np.int64)
            group_of_row[np.concatenate(row_parts)[order]] = group_of_sorted
            stats = SnapshotStats(firsts)
            for dimension in dimensions:
                stats.add_dimension(dimension)
            for table, offset in zip(tables, offsets, strict=True):
                for series in table.series.values():
                    if series.key[0] == node and series.key[3] in dimensions:
                        groups = group_of_row[series.row_numbers() + offset]
                        stats.add(series.key[3], groups, series.values.floats())
            result[node] = stats
        return result


class SnapshotStats:
    """Per snapshot of one node: its time, and min / max / sum / count of each dimension's values."""

    def __init__(self, stamps: list[float]) -> None:
        self.stamps = stamps
        self.min: dict[str, np.ndarray[Any, Any]] = {}
        self.max: dict[str, np.ndarray[Any, Any]] = {}
        self.sum: dict[str, np.ndarray[Any, Any]] = {}
        self.count: dict[str, np.ndarray[Any, Any]] = {}

    def add_dimension(self, dimension: str) -> None:
        n = len(self.stamps)
        self.min[dimension] = np.full(n, np.inf)
        self.max[dimension] = np.full(n, -np.inf)
        self.sum[dimension] = np.zeros(n)
        self.count[dimension] = np.zeros(n, dtype=np.int64)

    def add(self, dimension: str, groups: np.ndarray[Any, Any], values: np.ndarray[Any, Any]) -> None:
        # fmin / fmax skip NaN, as `any(v < t ...)` does; sums run in record order, as sum() does.
        np.fmin.at(self.min[dimension], groups, values)
        np.fmax.at(self.max[dimension], groups, values)
        np.add.at(self.sum[dimension], groups, values)
        np.add.at(self.count[dimension], groups, 1)


# --- steps -------------------------------------------------------------------------------------

STEP_NUMBERS = ("start", "duration", "data_wait", "compute", "communication")
STEP_LABELS = ("rank", "node", "phase", "epoch")
STEP_KEYS = ("rank", "node", "phase", "epoch", "step", *STEP_NUMBERS, "loss")
_NO_LOSS, _NULL_LOSS, _LOSS = 0, 1, 2


class StepTable:
    """One rank file's steps, in columns."""

    def __init__(self) -> None:
        self.labels = {name: Runs() for name in STEP_LABELS}
        self.step = Decimals(0)
        self.numbers = {name: Decimals(STEP_DECIMALS) for name in STEP_NUMBERS}
        self.loss = Floats()
        self.loss_state = Runs()
        self.size = 0
        self.skipped = 0

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        labels: dict[str, list[Any]] = {name: [] for name in STEP_LABELS}
        numbers: dict[str, list[float]] = {name: [] for name in ("step", *STEP_NUMBERS)}
        losses: list[float] = []
        states: list[int] = []
        for record in records:
            try:
                row = {"step": float(record["step"]), "start": float(record["start"])}
                row["duration"] = float(record["duration"])
                for name in ("data_wait", "compute", "communication"):
                    row[name] = float(record.get(name, 0.0))
            except (KeyError, TypeError, ValueError):
                self.skipped += 1
                continue
            for name, value in row.items():
                numbers[name].append(value)
            for name in STEP_LABELS:
                labels[name].append(record.get(name, ABSENT))
            loss = record.get("loss", ABSENT)
            if loss is ABSENT or loss is None:
                states.append(_NO_LOSS if loss is ABSENT else _NULL_LOSS)
                losses.append(float("nan"))
            else:
                states.append(_LOSS)
                losses.append(float(loss))
        for name, values in labels.items():
            self.labels[name].extend(values)
        self.step.extend(numbers.pop("step"))
        for name, column in self.numbers.items():
            column.extend(numbers[name])
        self.loss.extend(losses)
        self.loss_state.extend(states)
        self.size += len(states)

    def get(self, row: int, key: str) -> Any:
        """One field of one step, as the JSON line had it; ABSENT if it had none."""
        if key in self.numbers:
            return self.numbers[key].value(row)
        if key in self.labels:
            return self.labels[key].value(row)
        if key == "step":
            return self.step.whole(row)
        if key == "loss":
            state = self.loss_state.value(row)
            return ABSENT if state == _NO_LOSS else None if state == _NULL_LOSS else self.loss.value(row)
        return ABSENT

    def segments(self) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """(first row, end row, labels) of each stretch of rows whose labels are all the same;
        `labels` holds those the records had, as `record.get` would find them."""
        bounds = sorted({0, *(start for column in self.labels.values() for start in column.starts)})
        for first, end in zip(bounds, [*bounds[1:], self.size], strict=True):
            if first < end:
                labels = {name: column.value(first) for name, column in self.labels.items()}
                yield first, end, {name: value for name, value in labels.items() if value is not ABSENT}

    @property
    def nbytes(self) -> int:
        columns: list[Any] = [*self.labels.values(), *self.numbers.values(), self.step, self.loss, self.loss_state]
        return sum(column.nbytes for column in columns)


class StepArrays:
    """Steps of one group (a rank; a host and phase) as columns sorted by start time (stable, as
    `list.sort`): what the step rules and the report read. A column is made when first read."""

    def __init__(
        self, size: int, column: Callable[[str], np.ndarray[Any, Any]], label: Callable[[int, str], Any]
    ) -> None:
        self._size = size
        self._column = column  # a number column of the group, in record order
        self._label = label  # (position in record order, key) -> the record's value; None if none
        self._order = np.argsort(column("start"), kind="stable")
        self._sorted: dict[str, np.ndarray[Any, Any]] = {}

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> StepArrays:
        def column(name: str) -> np.ndarray[Any, Any]:
            if name in ("start", "duration"):
                return np.array([float(r[name]) for r in records], dtype=np.float64)
            return np.array([float(r.get(name, 0.0)) for r in records], dtype=np.float64)

        return cls(len(records), column, lambda position, key: records[position].get(key))

    def _numbers(self, name: str) -> np.ndarray[Any, Any]:
        values = self._sorted.get(name)
        if values is None:
            values = self._sorted[name] = self._column(name)[self._order]
        return values

    @property
    def start(self) -> np.ndarray[Any, Any]:
        return self._numbers("start")

    @property
    def duration(self) -> np.ndarray[Any, Any]:
        return self._numbers("duration")

    @property
    def data_wait(self) -> np.ndarray[Any, Any]:
        return self._numbers("data_wait")

    @property
    def compute(self) -> np.ndarray[Any, Any]:
        return self._numbers("compute")

    @property
    def communication(self) -> np.ndarray[Any, Any]:
        return self._numbers("communication")

    def __len__(self) -> int:
        return self._size

    def get(self, index: int, name: str, default: Any = None) -> Any:
        """A label (rank, node, phase, epoch) or `step` of the `index`th step by start time, as
        `record.get` gives it."""
        value = self._label(int(self._order[index]), name)
        return default if value is None or value is ABSENT else value


class StepView(Mapping[str, Any]):
    """One step, read from its table on access: what `read_steps` would give as a dict."""

    __slots__ = ("_row", "_table")

    def __init__(self, table: StepTable, row: int) -> None:
        self._table, self._row = table, row

    def __getitem__(self, key: str) -> Any:
        value = self._table.get(self._row, key)
        if value is ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self._table.get(self._row, key)
        return default if value is ABSENT else value

    def __iter__(self) -> Iterator[str]:
        return (key for key in STEP_KEYS if self._table.get(self._row, key) is not ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"StepView({dict(self)!r})"


def _group(pieces: list[tuple[StepTable, int, int]]) -> StepArrays:
    """The rows `first`..`end` of each table, one group in that order."""
    offsets = list(itertools.accumulate((end - first for _, first, end in pieces), initial=0))

    def column(name: str) -> np.ndarray[Any, Any]:
        return np.concatenate([table.numbers[name].floats(first, end) for table, first, end in pieces])

    def label(position: int, key: str) -> Any:
        piece = bisect.bisect_right(offsets, position) - 1
        table, first, _ = pieces[piece]
        row = first + position - offsets[piece]
        return table.step.whole(row) if key == "step" else table.labels[key].value(row)

    return StepArrays(offsets[-1], column, label)


class StepColumns(Sequence[Mapping[str, Any]]):
    """Every rank's steps, file by file (in file-name order, as `read_steps` reads)."""

    def __init__(self) -> None:
        self.tables: dict[str, StepTable] = {}

    def _ordered(self) -> list[StepTable]:
        return [self.tables[name] for name in sorted(self.tables)]

    def __len__(self) -> int:
        return sum(table.size for table in self.tables.values())

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for table in self._ordered():
            for row in range(table.size):
                yield StepView(table, row)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Mapping[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | list[Mapping[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        for table in self._ordered():
            if 0 <= position < table.size:
                return StepView(table, position)
            position -= table.size
        raise IndexError(index)

    def groups(
        self, key: Callable[[Mapping[str, Any]], Any], keep: Callable[[Mapping[str, Any]], bool]
    ) -> dict[Any, StepArrays]:
        """The steps `keep` accepts, grouped by `key`, each group sorted by start time.

        `key` and `keep` see only the labels (rank, node, phase, epoch): they are called once per
        stretch of rows that share them, not once per step.
        """
        parts: dict[Any, list[tuple[StepTable, int, int]]] = defaultdict(list)
        for table in self._ordered():
            for first, end, found in table.segments():
                if keep(found):
                    parts[key(found)].append((table, first, end))
        return {name: _group(pieces) for name, pieces in parts.items()}

    def starts(self) -> np.ndarray[Any, Any]:
        """Every step's start time, in file order."""
        arrays = [table.numbers["start"].floats() for table in self._ordered()]
        return np.concatenate(arrays) if arrays else np.empty(0)

    @property
    def nbytes(self) -> int:
        return sum(table.nbytes for table in self.tables.values())


# --- the files ---------------------------------------------------------------------------------


class ProfileStore:
    """`profile/` as read so far; `refresh()` reads what was appended since the previous call."""

    def __init__(self, profile_dir: Path) -> None:
        self.profile_dir = profile_dir
        self.system = SystemColumns()
        self.steps = StepColumns()
        self._tails: dict[Path, JsonlTail] = {}

    def refresh(self) -> int:
        """Reads the new lines of every file; returns how many records it added."""
        added = 0
        for folder, pattern, tables, make in (
            ("system", "*.jsonl", self.system.tables, SystemTable),
            ("steps", "rank*.jsonl", self.steps.tables, StepTable),
        ):
            paths = sorted((self.profile_dir / folder).glob(pattern))
            for gone in set(tables) - {path.name for path in paths}:
                del tables[gone]  # as a full read would no longer see it
                self._tails.pop(self.profile_dir / folder / gone, None)
            for path in paths:
                tail = self._tails.get(path)
                if tail is None:
                    tail = self._tails[path] = JsonlTail(path)
                if tail.poll() or path.name not in tables:
                    tables[path.name] = make()  # type: ignore[assignment]
                table: Any = tables[path.name]
                for batch in tail.read():
                    table.add(batch)
                    added += len(batch)
        return added

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (capacity included), a little less than the process holds."""
        return self.system.nbytes + self.steps.nbytes


# --- for readers of either kind ----------------------------------------------------------------


def group_steps(
    steps: Sequence[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], Any],
    keep: Callable[[Mapping[str, Any]], bool],
) -> dict[Any, StepArrays]:
    """Steps (dicts, or `StepColumns`) that `keep` accepts, grouped by `key`, each group sorted by
    start time (stable). `key` and `keep` may read only the labels: rank, node, phase, epoch."""
    if isinstance(steps, StepColumns):
        return steps.groups(key, keep)
    grouped: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for step in steps:
        if keep(step):
            grouped[key(step)].append(step)
    return {name: StepArrays.from_records(records) for name, records in grouped.items()}


def nodes_of(system: Sequence[Mapping[str, Any]]) -> set[str]:
    """The hosts that have system records."""
    if isinstance(system, SystemColumns):
        return system.nodes()
    return {str(record["NodeId"]) for record in system}


def points_of(system: Sequence[Mapping[str, Any]], dimension: str) -> dict[str, dict[str, tuple[Any, Any]]]:
    """node -> name -> (timestamps, values) of one dimension, in the records' order."""
    points: dict[str, dict[str, tuple[Any, Any]]] = defaultdict(dict)
    if isinstance(system, SystemColumns):
        for (node, name), pair in system.series(dimension).items():
            points[node][name] = pair
        return dict(points)
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for record in system:
        if record.get("Dimension") == dimension:
            grouped[(str(record["NodeId"]), str(record["Name"]))].append(
                (float(record["Timestamp"]), float(record["Value"]))
            )
    for (node, name), pairs in grouped.items():
        points[node][name] = (np.array([t for t, _ in pairs]), np.array([v for _, v in pairs]))
    return dict(points)


def ranks_of(steps: Sequence[Mapping[str, Any]]) -> set[int]:
    """The ranks that recorded steps (a step without one is rank 0's, as the rules read it)."""
    if isinstance(steps, StepColumns):
        return {int(labels.get("rank", 0)) for table in steps.tables.values() for _, _, labels in table.segments()}
    return {int(step.get("rank", 0)) for step in steps}
