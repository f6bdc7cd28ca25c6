"""profiler_mb_per_hour: what rank 0's online rule evaluation holds per hour of job, and what one
evaluation costs against a full re-read of every file.

    .venv/bin/python benchmarks/bench_profiler.py [--hours 1] [--ranks 8] [--cores 96]

Synthesizes, into a temporary folder and as the job runs, the profile an 8-rank job writes: one
host with 8 GPUs and 96 cores sampled every 500 ms (`SystemMonitor`'s default: 121 records a
snapshot) and 8 ranks at 4 steps a second each, with a 60 s validation pass (EVAL steps, 8
batches a second) every 20 minutes. Every `--every-minutes` of simulated job, rank 0's
background thread evaluates: `ProfileStore.refresh()` reads what was appended, then every rule
and the report (`Profiler.evaluate_now`). Measured side by side in one run:

- `profiler_mb_per_hour`: growth of the evaluator's state (tracemalloc: every allocation the
  store keeps, after each refresh), per simulated hour: the least-squares slope;
- `dict_records_mb_per_hour`: the same records held as one dict each, as `json.loads` makes
  them (the form the profiler held before its columns; measured here, the profiler has no such
  form any more), per hour (traced on the first stretch's records);
- `incremental_eval_seconds`: one online evaluation at the end of the job (read the last
  `--every-minutes`, evaluate, write `rules.json` and `report.html`), and
  `full_reread_eval_seconds`: the same evaluation after reading every file again into a fresh
  store; `full_vs_incremental_ratio` is the second over the first (median of `--repeats`), and
  the `*_read_seconds` are the reading alone;
- `evaluation_peak_mb`: what one online evaluation allocates beyond the state, at its peak.

Prints `name: value` lines. About 40 s on two cores with the defaults.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.profiling import report, rules  # noqa: E402
from trainer.profiling.store import ProfileStore  # noqa: E402

T0 = 1764687600.0
MB = 1024 * 1024


class Job:
    """Writes the profile of a running job, one stretch of simulated time at a time."""

    def __init__(self, profile: Path, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = np.random.default_rng(0)
        (profile / "system").mkdir(parents=True)
        (profile / "steps").mkdir()
        self.system = (profile / "system" / "algo-1.jsonl").open("a", encoding="utf-8")
        self.ranks = [(profile / "steps" / f"rank{r}.jsonl").open("a", encoding="utf-8") for r in range(args.ranks)]
        series = [("cpu", f"cpu{c}", "CPUUtilization") for c in range(args.cores)]
        series += [
            ("cpu", "cpu", "I/OWaitPercentage"),
            ("memory", "memory", "MemoryUtilization"),
            ("process", "dataloader", "DataLoaderWorkers"),
            ("process", "dataloader", "DataLoaderWorkersCPUUtilization"),
            ("process", "training", "TrainingProcesses"),
            ("io", "disk", "DiskReadBytesPerSecond"),
            ("io", "disk", "DiskWriteBytesPerSecond"),
            ("network", "network", "NetworkReceiveBytesPerSecond"),
            ("network", "network", "NetworkSendBytesPerSecond"),
        ]
        for gpu in range(args.ranks):
            series += [("gpu", f"gpu{gpu}", "GPUUtilization"), ("gpu", f"gpu{gpu}", "GPUMemoryUtilization")]
        self.series = series
        self.heads = [f'{{"Type":"{t}","Name":"{n}","Dimension":"{d}","Value":' for t, n, d in series]
        self.scale = np.array([_scale(d) for _, _, d in series])
        self.seconds = 0.0
        self.step = 0
        self.records = 0

    def run(self, seconds: float) -> None:
        """`seconds` more of the job: samples every interval, steps at the step rate."""
        end = self.seconds + seconds
        interval = self.args.interval_ms / 1000
        samples = round(seconds / interval)
        values = self.rng.random((samples, len(self.series))) * self.scale
        lines = []
        for i in range(samples):
            stamp = f"{T0 + self.seconds + i * interval + 0.002:.3f}"
            tail = f',"NodeId":"algo-1","Timestamp":{stamp}}}\n'
            lines.extend(
                f"{head}{round(value, 3)}{tail}" for head, value in zip(self.heads, values[i].tolist(), strict=True)
            )
        self.system.write("".join(lines))
        self.records += len(lines)
        self._steps(end)
        self.seconds = end
        for handle in (self.system, *self.ranks):
            handle.flush()

    def _steps(self, end: float) -> None:
        period = self.args.epoch_minutes * 60
        clock = self.seconds
        lines: list[list[str]] = [[] for _ in self.ranks]
        while clock < end:
            epoch, into = divmod(clock, period)
            evaluating = into >= period - self.args.eval_seconds
            rate = self.args.eval_batches_per_second if evaluating else self.args.steps_per_second
            if not evaluating:
                self.step += 1
            for rank, out in enumerate(lines):
                wait, compute = float(self.rng.random() * 0.02), float(0.2 + self.rng.random() * 0.03)
                phase = "EVAL" if evaluating else "TRAIN"
                step = int(into - (period - self.args.eval_seconds)) if evaluating else self.step
                loss = "" if evaluating else f',"loss":{float(np.float32(3 / math.sqrt(1 + self.step / 500)))}'
                out.append(
                    f'{{"rank":{rank},"node":"algo-1","phase":"{phase}","epoch":{int(epoch)},"step":{step},'
                    f'"start":{T0 + clock:.6f},"duration":{wait + compute:.6f},"data_wait":{wait:.6f},'
                    f'"compute":{compute:.6f},"communication":0.0{loss}}}\n'
                )
            clock += 1 / rate
        for handle, out in zip(self.ranks, lines, strict=True):
            handle.write("".join(out))
            self.records += len(out)

    def close(self) -> None:
        for handle in (self.system, *self.ranks):
            handle.close()


def _scale(dimension: str) -> float:
    if dimension.endswith("BytesPerSecond"):
        return 5e8
    return {"DataLoaderWorkers": 8, "TrainingProcesses": 8, "DataLoaderWorkersCPUUtilization": 800}.get(dimension, 100)


def online(held: ProfileStore, out: Path) -> tuple[float, float]:
    """Rank 0's periodic evaluation: (seconds reading, seconds in all)."""
    began = time.perf_counter()
    held.refresh()
    read = time.perf_counter() - began
    data = rules.ProfileData(system=held.system, steps=held.steps, started_at=T0 - 60)
    report.write_outputs(out, data, rules.evaluate(data))
    return read, time.perf_counter() - began


def full(profile: Path, out: Path) -> tuple[float, float]:
    """The same evaluation without a store kept between evaluations: every file read again."""
    began = time.perf_counter()
    held = ProfileStore(profile)
    held.refresh()
    read = time.perf_counter() - began
    data = rules.ProfileData(system=held.system, steps=held.steps, started_at=T0 - 60)
    report.write_outputs(out, data, rules.evaluate(data))
    return read, time.perf_counter() - began


def dicts(profile: Path) -> list[dict[str, Any]]:
    """Every record as a dict of its own: what holding the records without columns costs."""
    return [json.loads(line) for path in sorted(profile.rglob("*.jsonl")) for line in path.open(encoding="utf-8")]


def traced(action: Callable[[], Any]) -> tuple[Any, float]:
    """(what `action` returned, the MB it allocated and still holds), tracemalloc running."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    result = action()
    gc.collect()
    return result, (tracemalloc.get_traced_memory()[0] - before) / MB


def slope(points: list[tuple[float, float]]) -> float:
    hours, values = np.array(points).T
    return float(np.polyfit(hours, values, 1)[0])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The job simulated, the evaluator traced and timed: the figures `main` prints."""
    with tempfile.TemporaryDirectory() as folder:
        profile, out = Path(folder) / "profile", Path(folder) / "out"
        job = Job(profile, args)
        held = ProfileStore(profile)
        stretch = args.every_minutes * 60
        # The job's first --hours, the evaluator's state traced after each refresh.
        tracemalloc.start()
        points, state = [], 0.0
        for index in range(max(2, round(args.hours * 3600 / stretch))):
            print(f"simulated minute {(index + 1) * args.every_minutes:.0f}", file=sys.stderr)
            job.run(stretch)
            if not index:
                first = {path: path.stat().st_size for path in profile.rglob("*.jsonl")}
                first_hours, first_records = job.seconds / 3600, job.records
            _, grown = traced(held.refresh)
            state += grown
            points.append((job.seconds / 3600, state))
        traced_hours, traced_records = job.seconds / 3600, job.records
        tracemalloc.stop()
        # Then, untraced, a few more stretches: after each, the online evaluation (what was
        # appended) and the full re-read, at the same point of the job.
        online(held, out)  # warm-up: the first evaluation pays for numpy's and the report's first calls
        pairs = []
        for _ in range(args.repeats):
            job.run(stretch)
            pairs.append((online(held, out), full(profile, out)))
        job.close()
        # One online evaluation's transient memory, and the dicts a full re-read holds, traced.
        tracemalloc.start()
        gc.collect()
        resting = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        data = rules.ProfileData(system=held.system, steps=held.steps, started_at=T0 - 60)
        report.write_outputs(out, data, rules.evaluate(data))
        peak = (tracemalloc.get_traced_memory()[1] - resting) / MB
        del data
        # The dicts of the first stretch (as many a record as later ones), per hour.
        sample = Path(folder) / "sample"
        for path, size in first.items():
            copy = sample / path.relative_to(profile)
            copy.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as source:
                copy.write_bytes(source.read(size))
        _, dict_mb = traced(lambda: dicts(sample))
        tracemalloc.stop()
    return {
        "job": job,
        "hours": job.seconds / 3600,
        "traced_hours": traced_hours,
        "traced_records": traced_records,
        "mb_per_hour": slope(points),
        "state_mb": state,
        "columns_mb": held.nbytes / MB,
        "dict_mb_per_hour": dict_mb / first_hours,
        "dict_bytes_per_record": dict_mb * MB / first_records,
        "pairs": pairs,
        "peak_mb": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=0.5, help="simulated job whose state is traced")
    parser.add_argument("--ranks", type=int, default=8, help="ranks (one GPU each) on the host")
    parser.add_argument("--cores", type=int, default=96, help="the host's cores (one CPUUtilization series each)")
    parser.add_argument("--interval-ms", type=int, default=500, help="the sampler's interval")
    parser.add_argument("--steps-per-second", type=float, default=4.0, help="training steps per rank")
    parser.add_argument("--epoch-minutes", type=float, default=20.0, help="an epoch, its validation pass included")
    parser.add_argument("--eval-seconds", type=float, default=60.0, help="the validation pass")
    parser.add_argument("--eval-batches-per-second", type=float, default=8.0)
    parser.add_argument("--every-minutes", type=float, default=10.0, help="between two online evaluations")
    parser.add_argument("--repeats", type=int, default=2, help="timed evaluations (one stretch more each)")
    args = parser.parse_args()
    m = measure(args)
    job, pairs = m["job"], m["pairs"]
    print(
        f"job: {args.ranks} ranks, {args.cores} cores, {len(job.series)} records a snapshot every "
        f"{args.interval_ms} ms, {args.steps_per_second:g} steps/s per rank"
    )
    print(f"simulated_hours: {m['hours']:g} (the state traced over the first {m['traced_hours']:g})")
    print(f"records: {job.records} ({m['traced_records']} in the traced hours)")
    print(f"profiler_mb_per_hour: {m['mb_per_hour']:.2f}")
    print(f"profiler_state_mb: {m['state_mb']:.1f} after {m['traced_hours']:g} h")
    print(f"dict_records_mb_per_hour: {m['dict_mb_per_hour']:.1f} ({m['dict_bytes_per_record']:.0f} bytes a record)")
    print(f"incremental_read_seconds: {statistics.median(o[0] for o, _ in pairs):.3f}")
    print(f"incremental_eval_seconds: {statistics.median(o[1] for o, _ in pairs):.3f}")
    print(f"full_read_seconds: {statistics.median(f[0] for _, f in pairs):.3f}")
    print(f"full_reread_eval_seconds: {statistics.median(f[1] for _, f in pairs):.3f}")
    print(f"full_vs_incremental_ratio: {statistics.median(f[1] / o[1] for o, f in pairs):.2f}")
    print(f"evaluation_peak_mb: {m['peak_mb']:.1f}")


if __name__ == "__main__":
    main()
