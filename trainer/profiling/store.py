"""The profile as the rules and the report read it: columns, read as the files grow.

`ProfileStore(profile_dir, ...).refresh()` parses only what was appended to each folder's
`system/*.jsonl` and `steps/rank*.jsonl` since its previous call (`jsonl.JsonlTail`: remembered
offsets; a line still being written waits for the next call) and appends it to columns. No
record is kept as a dict:

- **system samples**, per file: one float64 timestamp per snapshot row (the records of one sample
  share it), and per series (node, type, name, dimension) its values. A series present in every
  row (as the sampler writes) stores no row numbers; one with gaps stores an int32 row per value.
- **steps**, per rank file: `step`, `start`, `duration`, `data_wait`, `compute`,
  `communication` and `loss` as numbers, and run-length encoded `rank`, `node`, `phase`,
  `epoch` and whether the step has a loss (they change at epoch and phase boundaries only). A
  step line without `step`, `start` or `duration` is skipped; a missing `data_wait`, `compute`
  or `communication` reads 0 (the trainer always writes all three).

Numbers take 4 bytes while that gives every value back exactly, else 8 (`columns.Numbers`): the
sampler rounds to 3 decimals and the step writer to 6, so those are int32 counts of 1/1000
(1/10**6) while they fit; a loss (a float32 tensor's `.item()`) is a float32. So: 4 bytes per
sampled percentage, 8 per byte-rate value, 8 per snapshot, about 32 per step, plus at most a
quarter more for the arrays' spare capacity. A host with 96 cores and 8 GPUs sampled every 500 ms (121 records a
snapshot) and 8 ranks at 4 steps a second hold about 8 MB per hour of job, where one dict per
record would hold about 940 bytes each (`benchmarks/bench_profiler.py` measures both).

The rules and the report read the columns through the methods below (`series`, `per_snapshot`,
`groups`, ...), which give the numbers the records hold without making one object per record.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from trainer.profiling.columns import GrowableArray, Numbers, Runs
from trainer.profiling.jsonl import JsonlTail

SeriesKey = tuple[str, Any, str, str]  # (node, type, name, dimension)
Labels = Mapping[str, Any]  # a step's rank, node, phase and epoch, those it has
SYSTEM_DECIMALS, STEP_DECIMALS = 3, 6
# Records of one node less than this apart (from a snapshot's first) are one snapshot, as
# Debugger's rules group them: a sample's records may be stamped a few ms apart.
SNAPSHOT_WINDOW_SECONDS = 0.02
_ABSENT: Any = object()  # a label the step line did not have


# --- system samples ----------------------------------------------------------------------------


class Series:
    """One metric of one host: its snapshot rows (implicit while it has one in every row) and values."""

    __slots__ = ("count", "first", "key", "rows", "values")

    def __init__(self, key: SeriesKey) -> None:
        self.key = key
        self.first = -1
        self.count = 0
        self.rows: GrowableArray | None = None  # None: the rows first, first + 1, ..., first + count - 1
        self.values = Numbers(SYSTEM_DECIMALS)

    def extend(self, rows: list[int], values: list[float]) -> None:
        if self.rows is None:
            if not self.count:
                self.first = rows[0]
            start = self.first + self.count
            if rows[0] == start and rows[-1] == start + len(rows) - 1 and _consecutive(rows):
                self.count += len(rows)
                self.values.extend(values)
                return
            self.rows = GrowableArray(np.int32)
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

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (self.rows.nbytes if self.rows is not None else 0) + 120


def _consecutive(rows: list[int]) -> bool:
    return all(b - a == 1 for a, b in itertools.pairwise(rows))


class SystemTable:
    """One system file's records: snapshot timestamps and the series, in the order first seen."""

    def __init__(self) -> None:
        self.stamps = GrowableArray(np.float64)
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

    @property
    def nbytes(self) -> int:
        return self.stamps.nbytes + sum(series.nbytes for series in self.series.values())


class SystemColumns:
    """Every host's system records, file by file (in the order `ProfileStore` reads them)."""

    def __init__(self) -> None:
        self.tables: dict[Path, SystemTable] = {}

    def __len__(self) -> int:
        return sum(table.records for table in self.tables.values())

    @property
    def nbytes(self) -> int:
        return sum(table.nbytes for table in self.tables.values())

    def _of(self, dimension: str | None = None) -> Iterator[tuple[SystemTable, Series]]:
        for table in self.tables.values():
            for series in table.series.values():
                if series.count and (dimension is None or series.key[3] == dimension):
                    yield table, series

    def has(self, dimension: str) -> bool:
        return any(True for _ in self._of(dimension))

    def series(self, dimension: str) -> dict[tuple[str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """(node, name) -> (timestamps, values) of one dimension, sorted by key, then by time and value."""
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
        """The hosts that have system records."""
        return {series.key[0] for _, series in self._of()}

    def time_range(self) -> tuple[float, float] | None:
        """The first and last timestamp of any record (None without any)."""
        ranges = []
        for table in self.tables.values():
            if table.records:
                stamps = table.stamps.view()
                ranges.append((float(stamps.min()), float(stamps.max())))
        if not ranges:
            return None
        return min(r[0] for r in ranges), max(r[1] for r in ranges)

    def per_snapshot(self, dimensions: Sequence[str]) -> dict[str, SnapshotStats]:
        """Per node (sorted), per snapshot: min, max, sum and count of each dimension's values.

        A node's records, in time order, fall into snapshots: a record more than
        `SNAPSHOT_WINDOW_SECONDS` after the current snapshot's first record starts the next.
        """
        result: dict[str, SnapshotStats] = {}
        for node in sorted(self.nodes()):
            tables = [t for t in self.tables.values() if any(s.key[0] == node and s.count for s in t.series.values())]
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

STEP_TIMES = ("start", "duration", "data_wait", "compute", "communication")
STEP_LABELS = ("rank", "node", "phase", "epoch")


class StepTable:
    """One rank file's steps, in columns."""

    def __init__(self) -> None:
        self.labels = {name: Runs() for name in STEP_LABELS}
        self.numbers = {"step": Numbers(0), **{name: Numbers(STEP_DECIMALS) for name in STEP_TIMES}}
        self.numbers["loss"] = Numbers(None)
        self.has_loss = Runs()
        self.size = 0
        self.skipped = 0

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        labels: dict[str, list[Any]] = {name: [] for name in STEP_LABELS}
        numbers: dict[str, list[float]] = {name: [] for name in self.numbers}
        has_loss: list[bool] = []
        for record in records:
            try:
                row = {"step": float(record["step"]), "start": float(record["start"])}
                row["duration"] = float(record["duration"])
                for name in ("data_wait", "compute", "communication"):
                    row[name] = float(record.get(name, 0.0))
            except (KeyError, TypeError, ValueError):
                self.skipped += 1
                continue
            loss = record.get("loss")  # null (a non-finite loss) or absent: none
            row["loss"] = float("nan") if loss is None else float(loss)
            for name, value in row.items():
                numbers[name].append(value)
            for name in STEP_LABELS:
                labels[name].append(record.get(name, _ABSENT))
            has_loss.append(loss is not None)
        for name, values in labels.items():
            self.labels[name].extend(values)
        for name, column in self.numbers.items():
            column.extend(numbers[name])
        self.has_loss.extend(has_loss)
        self.size += len(has_loss)

    def column(self, name: str, first: int = 0, end: int | None = None) -> np.ndarray[Any, Any]:
        """Rows `first`..`end` of a number column, or of `has_loss` (booleans)."""
        if name == "has_loss":
            return self.has_loss.flags(first, self.size if end is None else end)
        return self.numbers[name].floats(first, end)

    def segments(self) -> Iterator[tuple[int, int, Labels]]:
        """(first row, end row, labels) of each stretch of rows whose labels are all the same;
        `labels` holds those the lines had, as `record.get` would find them."""
        bounds = sorted({0, *(start for column in self.labels.values() for start in column.starts)})
        for first, end in zip(bounds, [*bounds[1:], self.size], strict=True):
            if first < end:
                labels = {name: column.value(first) for name, column in self.labels.items()}
                yield first, end, {name: value for name, value in labels.items() if value is not _ABSENT}

    @property
    def nbytes(self) -> int:
        columns: list[Any] = [*self.labels.values(), *self.numbers.values(), self.has_loss]
        return sum(column.nbytes for column in columns)


class StepArrays:
    """Steps of one group (a rank; a host and phase) as columns, sorted by start time (stable, as
    `list.sort`) unless asked for file order: what the step rules and the report read. A column
    is made when first read."""

    def __init__(
        self,
        size: int,
        column: Callable[[str], np.ndarray[Any, Any]],
        label: Callable[[int, str], Any],
        *,
        by_start: bool = True,
    ) -> None:
        self._size = size
        self._column = column  # a column of the group, in file order
        self._label = label  # (position in file order, key) -> the line's value, or _ABSENT
        self._order = np.argsort(column("start"), kind="stable") if by_start else np.arange(size)
        self._sorted: dict[str, np.ndarray[Any, Any]] = {}

    def column(self, name: str) -> np.ndarray[Any, Any]:
        """`step`, `loss` (NaN where `has_loss` is False), `has_loss`, or one of the step times."""
        values = self._sorted.get(name)
        if values is None:
            values = self._sorted[name] = self._column(name)[self._order]
        return values

    @property
    def start(self) -> np.ndarray[Any, Any]:
        return self.column("start")

    @property
    def duration(self) -> np.ndarray[Any, Any]:
        return self.column("duration")

    @property
    def data_wait(self) -> np.ndarray[Any, Any]:
        return self.column("data_wait")

    @property
    def compute(self) -> np.ndarray[Any, Any]:
        return self.column("compute")

    @property
    def communication(self) -> np.ndarray[Any, Any]:
        return self.column("communication")

    def __len__(self) -> int:
        return self._size

    def get(self, index: int, name: str, default: Any = None) -> Any:
        """A label (rank, node, phase, epoch) or `step` of the `index`th step, as `record.get`
        gives it."""
        value = self._label(int(self._order[index]), name)
        return default if value is None or value is _ABSENT else value


def _group(pieces: list[tuple[StepTable, int, int]], by_start: bool) -> StepArrays:
    """The rows `first`..`end` of each table, one group in that order."""
    offsets = list(itertools.accumulate((end - first for _, first, end in pieces), initial=0))

    def column(name: str) -> np.ndarray[Any, Any]:
        return np.concatenate([table.column(name, first, end) for table, first, end in pieces])

    def label(position: int, key: str) -> Any:
        piece = bisect.bisect_right(offsets, position) - 1
        table, first, _ = pieces[piece]
        row = first + position - offsets[piece]
        return table.numbers["step"].whole(row) if key == "step" else table.labels[key].value(row)

    return StepArrays(offsets[-1], column, label, by_start=by_start)


class StepColumns:
    """Every rank's steps, file by file (in the order `ProfileStore` reads them)."""

    def __init__(self) -> None:
        self.tables: dict[Path, StepTable] = {}

    def __len__(self) -> int:
        return sum(table.size for table in self.tables.values())

    @property
    def nbytes(self) -> int:
        return sum(table.nbytes for table in self.tables.values())

    def groups(
        self, key: Callable[[Labels], Any], keep: Callable[[Labels], bool], *, by_start: bool = True
    ) -> dict[Any, StepArrays]:
        """The steps `keep` accepts, grouped by `key`, each group sorted by start time (or in file
        order). `key` and `keep` see only the labels a step line has (of rank, node, phase,
        epoch): they are called once per stretch of rows that share them, not once per step."""
        parts: dict[Any, list[tuple[StepTable, int, int]]] = defaultdict(list)
        for table in self.tables.values():
            for first, end, found in table.segments():
                if keep(found):
                    parts[key(found)].append((table, first, end))
        return {name: _group(pieces, by_start) for name, pieces in parts.items()}

    def column(self, name: str) -> np.ndarray[Any, Any]:
        """One number column of every step, in file order."""
        arrays = [table.column(name) for table in self.tables.values()]
        return np.concatenate(arrays) if arrays else np.empty(0)

    def ranks(self) -> set[int]:
        """The ranks that recorded steps (a step without one is rank 0's, as the rules read it)."""
        return {int(labels.get("rank", 0)) for table in self.tables.values() for _, _, labels in table.segments()}


# --- the files ---------------------------------------------------------------------------------

Table = TypeVar("Table", SystemTable, StepTable)


class ProfileStore:
    """Profile folders (`profile/`, one per host where they are apart) as read so far;
    `refresh()` reads what was appended since the previous call."""

    def __init__(self, *profile_dirs: Path) -> None:
        self.profile_dirs = profile_dirs
        self.system = SystemColumns()
        self.steps = StepColumns()
        self._tails: dict[Path, JsonlTail] = {}

    def refresh(self) -> int:
        """Reads the new lines of every file; returns how many records it added."""
        added = self._read("system", "*.jsonl", self.system.tables, SystemTable)
        return added + self._read("steps", "rank*.jsonl", self.steps.tables, StepTable)

    def _read(self, folder: str, pattern: str, tables: dict[Path, Table], make: Callable[[], Table]) -> int:
        paths = [path for profile in self.profile_dirs for path in sorted((profile / folder).glob(pattern))]
        held = dict(tables)
        tables.clear()  # refilled in file order; a file gone is gone, as a full read would not see it
        added = 0
        for path in paths:
            tail = self._tails.get(path)
            if tail is None:
                tail = self._tails[path] = JsonlTail(path)
            table = held.get(path)
            if tail.poll() or table is None:
                table = make()  # a new file, or one replaced (rank 0 writes other hosts' whole)
            tables[tail.path] = table  # keyed by the tail's own Path: no second one held per file
            for batch in tail.read():
                table.add(batch)
                added += len(batch)
        for gone in held.keys() - tables.keys():
            self._tails.pop(gone, None)
        return added

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (capacity included), a little less than the process holds."""
        return self.system.nbytes + self.steps.nbytes
