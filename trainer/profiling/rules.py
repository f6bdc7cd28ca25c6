"""SageMaker Debugger's built-in profiler rules, evaluated on our own samples; pure functions.

The inputs are what the trainer writes: Debugger-format system records (`monitor.py`) and
per-rank step lines (`steps.py`). Each rule follows the definition and the defaults of
Debugger's rule (smdebug `profiler/analysis/rules/*.py` and the SDK's rulesconfig), including
how it is invoked: every `scan_interval_s` (60 s) of timeline, on everything seen so far, each
scan where the condition holds counting as a trigger (Debugger's `RuleTriggered`).

Short runs: where a rule has fewer samples than its `patience` (or `window`), it would never
judge; it is then evaluated with patience and window both scaled to 20 % of the samples
available (never above their configured values), and the result's `detail` says so.

Divergences from Debugger, where its code as found looks like a bug (we follow the documented
intent):

- **GPUMemoryIncrease**: Debugger compares `mean(v[-window:])` with `mean(v[-window-1:-2])`, a
  slice of 9 values for the default window of 10 that also skips the newest-but-one sample. We
  compare it with the moving average one sample earlier, `mean(v[-window-1:-1])` (10 values),
  which is what its docstring describes ("compares it against the moving average of previous
  iteration").
- **LoadBalancing**: Debugger's histogram edges are `np.arange(0, 100, 2)` (0…98), so any value
  above 98 %, including a saturated GPU's 100 %, falls outside every bin and a busy GPU gives an
  empty histogram (and a NaN distance). We use edges 0, 2, …, 100, which count 100 % in the last
  bin. The threshold default is the SDK's 0.5 (the rule class says 0.2).
- **Dataloader**: Debugger counts the distinct PIDs of its framework trace's DataLoaderWorker and
  DataLoaderIter events each second: the workers plus the training processes that iterate the
  loader. We count the same processes from the host (`DataLoaderWorkers`, the training processes'
  children, plus `TrainingProcesses`), so with `--workers 0` the training processes still count,
  as in Debugger.
- **LossNotDecreasing** (Debugger's generic rule, not a profiler rule): the loss compared at each
  check is the mean training loss of the `num_steps` steps since the previous check (averaged over
  ranks), not one step's value, so SGD noise does not fire it on its own. Semantics followed:
  every `num_steps` steps, if the loss went up, it is a violation only when it exceeds the lowest
  loss seen so far by more than `increase_threshold_percent`; if it went down, a violation when
  it went down by less than `diff_percent` of the previous value (0: never).
- **StepOutlier**: durations come from our step lines (all ranks of a node together, per
  phase), not from Debugger's framework trace.

Our own rule, **DataStall**: per rank, the median over the last `window` TRAIN steps of the stall
fraction (data wait / step time) after `patience` steps; IssuesFound when it exceeds `threshold`
(0.2). It needs no GPU, so it is the direct evidence on CPU hosts.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Record = dict[str, Any]

SHORT_RUN_FRACTION = 0.2
SNAPSHOT_WINDOW_SECONDS = 0.02
SCAN_INTERVAL_SECONDS = 60.0
# Below this many samples no rule judges at all: a percentile of 3 values says nothing.
MIN_SAMPLES = 5
# Evidence lists are cut to this many items, with a count of the rest.
MAX_EVIDENCE_ITEMS = 20

STATUS_OK, STATUS_ISSUES, STATUS_ERROR = "NoIssuesFound", "IssuesFound", "Error"

DEFAULTS: dict[str, dict[str, Any]] = {
    "LowGPUUtilization": {"threshold_p95": 70, "threshold_p5": 10, "window": 500, "patience": 1000},
    "CPUBottleneck": {"threshold": 50, "gpu_threshold": 10, "cpu_threshold": 90, "patience": 1000},
    "IOBottleneck": {"threshold": 50, "gpu_threshold": 10, "io_threshold": 50, "patience": 1000},
    "StepOutlier": {"stddev": 3, "mode": None, "n_outliers": 10, "n_steps": 100},
    "BatchSize": {
        "cpu_threshold_p95": 70,
        "gpu_threshold_p95": 70,
        "gpu_memory_threshold_p95": 70,
        "patience": 1000,
        "window": 500,
    },
    "Dataloader": {"min_threshold": 70, "max_threshold": 200, "patience": 10},
    "GPUMemoryIncrease": {"increase": 5, "patience": 1000, "window": 10},
    "LoadBalancing": {"threshold": 0.5, "patience": 1000},
    "MaxInitializationTime": {"threshold": 20},
    "OverallSystemUsage": {},
    "LossNotDecreasing": {
        "num_steps": 10,
        "diff_percent": 0.0,
        "increase_threshold_percent": 5,
        "mode": "TRAIN",
    },
    "DataStall": {"threshold": 0.2, "window": 500, "patience": 100},
}
RULE_NAMES: tuple[str, ...] = tuple(DEFAULTS)


@dataclass
class ProfileData:
    """Everything the rules look at."""

    system: list[Record] = field(default_factory=list)
    steps: list[Record] = field(default_factory=list)
    # When the job started and the newest moment seen (epoch seconds); from the data if None.
    started_at: float | None = None
    now: float | None = None
    # The data loader's settings (workers, decoder, ...), named in DataStall's advice.
    loader: dict[str, Any] = field(default_factory=dict)


@dataclass
class RuleEvaluation:
    """One rule's verdict; `to_dict()` has the shape of `rules.json`'s rule entries."""

    name: str
    status: str
    trigger_count: int = 0
    violations: int | None = None
    datapoints: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    recommendation: str = ""
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "trigger_count": self.trigger_count,
            "violations": self.violations,
            "datapoints": self.datapoints,
            "evidence": _jsonable(self.evidence),
            "parameters": self.parameters,
            "recommendation": self.recommendation,
            "detail": self.detail,
            "source": "builtin",
            "report_uri": None,
        }


# --- helpers ------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars become floats, NaN becomes None, tuples lists."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return round(number, 4) if math.isfinite(number) else None
    return value


def _cut(items: list[Any]) -> dict[str, Any]:
    return {"items": items[:MAX_EVIDENCE_ITEMS], "count": len(items)}


def _scale(n: int, patience: int, window: int | None = None) -> tuple[int, int | None, bool]:
    """(patience, window, scaled): 20 % of the samples when the run is shorter than either."""
    if n > patience and (window is None or n > window):
        return patience, window, False
    reduced = max(1, int(n * SHORT_RUN_FRACTION))
    return min(patience, reduced), (None if window is None else min(window, reduced)), True


def _scaled_note(n: int, patience: int, window: int | None, what: str = "patience") -> str:
    if n < MIN_SAMPLES:
        return f"only {n} samples: too few to judge (at least {MIN_SAMPLES})"
    window_text = f" and window {window}" if window is not None else ""
    return (
        f"short run: only {n} samples, fewer than the configured {what}, so the rule ran with "
        f"{what} {patience}{window_text} (20 % of the samples available)"
    )


def _scan_ends(timestamps: Sequence[float], interval: float) -> list[float]:
    """Debugger invokes each rule every `interval` seconds of timeline; the last scan at the end."""
    if not timestamps:
        return []
    first, last = min(timestamps), max(timestamps)
    ends = []
    end = first + interval
    while end < last:
        ends.append(end)
        end += interval
    ends.append(last)
    return ends


def _upto(stamps: Any, end: float) -> int:
    """How many of the sorted timestamps are at or before `end`."""
    return int(np.searchsorted(stamps, end, side="right"))


def _series(system: list[Record], dimension: str) -> dict[tuple[str, str], tuple[Any, Any]]:
    """(node, name) -> (timestamps, values), sorted by time, for one dimension."""
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for record in system:
        if record.get("Dimension") == dimension:
            grouped[(str(record["NodeId"]), str(record["Name"]))].append(
                (float(record["Timestamp"]), float(record["Value"]))
            )
    series = {}
    for key, points in sorted(grouped.items()):
        points.sort()
        series[key] = (
            np.array([t for t, _ in points], dtype=float),
            np.array([v for _, v in points], dtype=float),
        )
    return series


def _snapshots(system: list[Record]) -> dict[str, list[tuple[float, list[Record]]]]:
    """Per node: records grouped into snapshots (a gap of more than 0.02 s starts a new one)."""
    by_node: dict[str, list[Record]] = defaultdict(list)
    for record in system:
        by_node[str(record["NodeId"])].append(record)
    snapshots: dict[str, list[tuple[float, list[Record]]]] = {}
    for node, records in sorted(by_node.items()):
        records.sort(key=lambda r: float(r["Timestamp"]))
        groups: list[tuple[float, list[Record]]] = []
        for record in records:
            stamp = float(record["Timestamp"])
            if groups and stamp - groups[-1][0] <= SNAPSHOT_WINDOW_SECONDS:
                groups[-1][1].append(record)
            else:
                groups.append((stamp, [record]))
        snapshots[node] = groups
    return snapshots


def _has(system: list[Record], dimension: str) -> bool:
    return any(record.get("Dimension") == dimension for record in system)


def _params(values: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in values.items()}


def _q(values: Any, quantile: float) -> float:
    return float(np.quantile(values, quantile))


def _pct(value: float) -> str:
    return f"{value:.0f} %"


NO_GPU = "no GPU metrics on this run (a CPU host, or no NVML/nvidia-smi): nothing to judge"


# --- the GPU rules ------------------------------------------------------------------------------


def low_gpu_utilization(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("LowGPUUtilization", STATUS_OK, parameters=_params(p))
    series = _series(data.system, "GPUUtilization")
    if not series:
        result.detail = NO_GPU
        return result
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    for (node, gpu), (stamps, values) in series.items():
        datapoints = max(datapoints, len(values))
        patience, window, scaled = _scale(len(values), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(values), patience, window))
        if len(values) < MIN_SAMPLES:
            continue
        last: dict[str, Any] | None = None
        for end in _scan_ends(stamps.tolist(), interval):
            seen = values[: _upto(stamps, end)]
            if len(seen) <= patience:
                continue
            recent = seen[-window:]
            p95, p5 = _q(recent, 0.95), _q(recent, 0.05)
            kind = None
            if p95 < float(p["threshold_p95"]):
                kind = "underutilized"
            elif p95 > float(p["threshold_p95"]) and p5 < float(p["threshold_p5"]):
                kind = "fluctuating"
            if kind is not None:
                result.trigger_count += 1
                last = {"host": node, "gpu": gpu, "kind": kind, "p95": p95, "p5": p5}
        if last is not None:
            found.append(last)
    result.violations, result.datapoints = result.trigger_count, datapoints
    result.detail = "; ".join(sorted(set(notes))) or None
    if found:
        result.status = STATUS_ISSUES
        result.evidence = {"gpus": found, "hosts": sorted({f["host"] for f in found})}
        worst = min(found, key=lambda f: f["p95"])
        if worst["kind"] == "underutilized":
            result.recommendation = (
                f"{worst['gpu']} on {worst['host']} was busy less than {p['threshold_p95']} % of "
                f"the time (95th percentile {_pct(worst['p95'])}): it waits for work. Feed it "
                "faster (more data-loader workers, faster decoding) or raise the batch size."
            )
        else:
            result.recommendation = (
                f"{worst['gpu']} on {worst['host']} swings between {_pct(worst['p5'])} and "
                f"{_pct(worst['p95'])} utilization: it idles between bursts, usually waiting for "
                "data or a synchronisation. Check the step timeline's data wait."
            )
    return result


def _bottleneck(
    data: ProfileData, p: Mapping[str, Any], *, name: str, dimension: str, key: str, what: str
) -> RuleEvaluation:
    """CPUBottleneck and IOBottleneck: the share of snapshots with a starved GPU and a busy host."""
    result = RuleEvaluation(name, STATUS_OK, parameters=_params(p))
    if not _has(data.system, "GPUUtilization"):
        result.detail = NO_GPU
        return result
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    evidence: list[dict[str, Any]] = []
    notes = []
    total_points = 0
    for node, snapshots in _snapshots(data.system).items():
        flags = []
        for _, records in snapshots:
            gpu_low = any(
                r["Dimension"] == "GPUUtilization" and float(r["Value"]) < float(p["gpu_threshold"]) for r in records
            )
            busy = any(r["Dimension"] == dimension and float(r["Value"]) > float(p[key]) for r in records)
            flags.append(gpu_low and busy)
        stamps = [stamp for stamp, _ in snapshots]
        total_points += len(flags)
        patience, _, scaled = _scale(len(flags), int(p["patience"]))
        if scaled:
            notes.append(_scaled_note(len(flags), patience, None))
        if len(flags) < MIN_SAMPLES:
            continue
        counts = np.cumsum(flags)
        percent = 0.0
        triggered = 0
        for end in _scan_ends(stamps, interval):
            n = bisect.bisect_right(stamps, end)
            if n <= patience:
                continue
            percent = 100.0 * float(counts[n - 1]) / n
            if percent > float(p["threshold"]):
                triggered += 1
        result.trigger_count += triggered
        evidence.append(
            {
                "host": node,
                "snapshots": len(flags),
                "bottlenecks": int(counts[-1]),
                "percent": percent,
                "triggered": triggered,
            }
        )
    result.violations, result.datapoints = result.trigger_count, total_points
    result.evidence = {"hosts": evidence}
    result.detail = "; ".join(sorted(set(notes))) or None
    if result.trigger_count:
        result.status = STATUS_ISSUES
        worst = max(evidence, key=lambda e: e["percent"])
        result.recommendation = (
            f"On {worst['host']}, {_pct(worst['percent'])} of the samples had a GPU below "
            f"{p['gpu_threshold']} % while {what}: the GPU waits on the host. "
            + (
                "Move decoding and augmentation off the training processes (more loader "
                "workers) or onto the GPU, or use a larger instance."
                if name == "CPUBottleneck"
                else "Read data from faster storage (FSx, local copies), in larger files, or prefetch more."
            )
        )
    return result


def cpu_bottleneck(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    what = f"a CPU core was above {p['cpu_threshold']} %"
    return _bottleneck(data, p, name="CPUBottleneck", dimension="CPUUtilization", key="cpu_threshold", what=what)


def io_bottleneck(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    what = f"I/O wait was above {p['io_threshold']} %"
    return _bottleneck(data, p, name="IOBottleneck", dimension="I/OWaitPercentage", key="io_threshold", what=what)


def batch_size(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("BatchSize", STATUS_OK, parameters=_params(p))
    gpu_util = _series(data.system, "GPUUtilization")
    if not gpu_util:
        result.detail = NO_GPU
        return result
    gpu_memory = _series(data.system, "GPUMemoryUtilization")
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    for node, snapshots in _snapshots(data.system).items():
        cpu_stamps, cpu_total = [], []
        for stamp, records in snapshots:
            cores = [float(r["Value"]) for r in records if r["Dimension"] == "CPUUtilization"]
            if cores:
                cpu_stamps.append(stamp)
                cpu_total.append(sum(cores) / len(cores))
        datapoints = max(datapoints, len(cpu_total))
        patience, window, scaled = _scale(len(cpu_total), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(cpu_total), patience, window))
        if len(cpu_total) < MIN_SAMPLES:
            continue
        cpu = np.array(cpu_total)
        for end in _scan_ends(cpu_stamps, interval):
            n = bisect.bisect_right(cpu_stamps, end)
            if n <= window or n <= patience:
                continue
            cpu_p95 = _q(cpu[:n][-window:], 0.95)
            if cpu_p95 >= float(p["cpu_threshold_p95"]):
                continue
            for (gpu_node, gpu), (stamps, values) in gpu_util.items():
                if gpu_node != node:
                    continue
                k = _upto(stamps, end)
                memory = gpu_memory.get((node, gpu))
                if k <= window or memory is None:
                    continue
                util_p95 = _q(values[:k][-window:], 0.95)
                m = _upto(memory[0], end)
                memory_p95 = _q(memory[1][:m][-window:], 0.95) if m else 0.0
                if util_p95 < float(p["gpu_threshold_p95"]) and memory_p95 < float(p["gpu_memory_threshold_p95"]):
                    result.trigger_count += 1
                    found.append(
                        {
                            "host": node,
                            "gpu": gpu,
                            "cpu_p95": cpu_p95,
                            "gpu_p95": util_p95,
                            "gpu_memory_p95": memory_p95,
                        }
                    )
    result.violations, result.datapoints = result.trigger_count, datapoints
    result.detail = "; ".join(sorted(set(notes))) or None
    if found:
        result.status = STATUS_ISSUES
        last = found[-1]
        result.evidence = {"gpus": _cut(found)}
        result.recommendation = (
            f"{last['gpu']} on {last['host']} is under-used: GPU {_pct(last['gpu_p95'])}, its "
            f"memory {_pct(last['gpu_memory_p95'])} and the CPUs {_pct(last['cpu_p95'])} at the "
            "95th percentile. A larger batch size (with a scaled learning rate) or a smaller "
            "instance would use it better."
        )
    return result


def gpu_memory_increase(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    result = RuleEvaluation("GPUMemoryIncrease", STATUS_OK, parameters=_params(p))
    series = _series(data.system, "GPUMemoryUtilization")
    if not series:
        result.detail = NO_GPU
        return result
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    for (node, gpu), (_, values) in series.items():
        datapoints = max(datapoints, len(values))
        patience, window, scaled = _scale(len(values), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(values), patience, window))
        if len(values) < MIN_SAMPLES or len(values) <= window + 1:
            continue
        # Checked after every datapoint, as Debugger does: with i values seen, the moving average
        # of the last `window` minus the one a sample earlier (see the module's divergences).
        sums = np.concatenate([[0.0], np.cumsum(values)])
        seen = np.arange(window + 2, len(values) + 1)
        now = (sums[seen] - sums[seen - window]) / window
        before = (sums[seen - 1] - sums[seen - 1 - window]) / window
        diff = now - before
        hits = (diff > float(p["increase"])) & (seen > patience)
        count = int(hits.sum())
        if count:
            result.trigger_count += count
            found.append(
                {
                    "host": node,
                    "gpu": gpu,
                    "increase": float(diff[hits].max()),
                    "violations": count,
                    "last": float(values[-1]),
                }
            )
    result.violations, result.datapoints = result.trigger_count, datapoints
    result.detail = "; ".join(sorted(set(notes))) or None
    if found:
        result.status = STATUS_ISSUES
        worst = max(found, key=lambda f: f["increase"])
        result.evidence = {"gpus": found}
        result.recommendation = (
            f"Memory of {worst['gpu']} on {worst['host']} rose by up to "
            f"{worst['increase']:.1f} points of its moving average (limit {p['increase']}); it "
            f"ended at {_pct(worst['last'])}. Look for tensors kept across steps (a loss summed "
            "without .item(), growing lists); a run that keeps growing will run out of memory."
        )
    return result


def _js_distance(first: Any, second: Any) -> float:
    """Jensen-Shannon distance of two histograms (natural log, as scipy's entropy)."""
    p, q = first / first.sum(), second / second.sum()
    m = (p + q) / 2

    def kl(a: Any, b: Any) -> float:
        keep = a > 0
        return float(np.sum(a[keep] * np.log(a[keep] / b[keep])))

    return math.sqrt(max(0.0, (kl(p, m) + kl(q, m)) / 2))


def load_balancing(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("LoadBalancing", STATUS_OK, parameters=_params(p))
    series = _series(data.system, "GPUUtilization")
    if not series:
        result.detail = NO_GPU
        return result
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    # 0, 2, ..., 100: a saturated GPU's 100 % is counted (divergence: see the module docstring).
    edges = np.arange(0, 101, 2)
    found: list[dict[str, Any]] = []
    notes = []
    by_node: dict[str, list[tuple[str, Any, Any]]] = defaultdict(list)
    for (node, gpu), (stamps, values) in series.items():
        by_node[node].append((gpu, stamps, values))
    for node, gpus in by_node.items():
        for i, (gpu_a, stamps_a, values_a) in enumerate(gpus):
            patience, _, scaled = _scale(len(values_a), int(p["patience"]))
            if scaled:
                notes.append(_scaled_note(len(values_a), patience, None))
            if len(values_a) < MIN_SAMPLES:
                continue
            for gpu_b, stamps_b, values_b in gpus[i + 1 :]:
                distance = 0.0
                for end in _scan_ends(stamps_a.tolist(), interval):
                    a = values_a[: _upto(stamps_a, end)]
                    b = values_b[: _upto(stamps_b, end)]
                    if len(a) <= patience or not len(b):
                        continue
                    h_a = np.histogram(a, bins=edges)[0].astype(float)
                    h_b = np.histogram(b, bins=edges)[0].astype(float)
                    if h_a.sum() == 0 or h_b.sum() == 0:
                        continue
                    distance = _js_distance(h_a, h_b)
                    if distance > float(p["threshold"]):
                        result.trigger_count += 1
                if distance > float(p["threshold"]):
                    found.append({"host": node, "gpus": [gpu_a, gpu_b], "distance": distance})
    result.violations = result.trigger_count
    result.datapoints = max((len(v) for _, v in series.values()), default=0)
    result.detail = "; ".join(sorted(set(notes))) or None
    if found:
        result.status = STATUS_ISSUES
        worst = max(found, key=lambda f: f["distance"])
        result.evidence = {"pairs": found}
        result.recommendation = (
            f"{worst['gpus'][0]} and {worst['gpus'][1]} on {worst['host']} are loaded unevenly "
            f"(Jensen-Shannon distance {worst['distance']:.2f} > {p['threshold']}): one waits "
            "for the other at every all-reduce. Check that every rank gets the same batch size "
            "and image sizes, and that no rank does extra work (logging, evaluation)."
        )
    return result


# --- step-based rules ---------------------------------------------------------------------------


def step_outlier(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    result = RuleEvaluation("StepOutlier", STATUS_OK, parameters=_params(p))
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    mode = p.get("mode")
    grouped: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for step in data.steps:
        if mode in (None, "None", "") or step.get("phase") == mode:
            grouped[(str(step.get("node", "")), str(step.get("phase", "TRAIN")))].append(step)
    found: list[dict[str, Any]] = []
    notes = []
    for (node, phase), steps in sorted(grouped.items()):
        steps.sort(key=lambda s: float(s["start"]))
        needed, _, scaled = _scale(len(steps), int(p["n_steps"]))
        if scaled:
            notes.append(_scaled_note(len(steps), needed, None, "n_steps"))
        if len(steps) < MIN_SAMPLES:
            continue
        stamps = [float(s["start"]) for s in steps]
        durations = np.array([float(s["duration"]) for s in steps])
        last: dict[str, Any] | None = None
        for end in _scan_ends(stamps, interval):
            n = bisect.bisect_right(stamps, end)
            if n <= needed:
                continue
            seen = durations[:n]
            threshold = float(seen.mean() + float(p["stddev"]) * seen.std())
            outliers = np.flatnonzero(seen > threshold)
            if len(outliers) > int(p["n_outliers"]):
                result.trigger_count += 1
                last = {
                    "host": node,
                    "phase": phase,
                    "threshold_seconds": threshold,
                    "mean_seconds": float(seen.mean()),
                    "outliers": len(outliers),
                    "steps": [
                        {"rank": steps[i].get("rank"), "step": steps[i].get("step"), "seconds": float(durations[i])}
                        for i in outliers[:MAX_EVIDENCE_ITEMS]
                    ],
                }
        if last is not None:
            found.append(last)
    result.violations = result.trigger_count
    result.datapoints = len(data.steps)
    result.detail = "; ".join(sorted(set(notes))) or None
    if found:
        result.status = STATUS_ISSUES
        worst = max(found, key=lambda f: f["outliers"])
        result.evidence = {"groups": found}
        result.recommendation = (
            f"{worst['outliers']} {worst['phase']} steps on {worst['host']} took longer than "
            f"{worst['threshold_seconds']:.3f} s (mean {worst['mean_seconds']:.3f} s + "
            f"{p['stddev']} standard deviations). Look at what those steps share: the first step "
            "of an epoch (loader start-up), checkpoints, evaluation, another job on the host."
        )
    return result


def data_stall(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    result = RuleEvaluation("DataStall", STATUS_OK, parameters=_params(p))
    by_rank: dict[int, list[Record]] = defaultdict(list)
    for step in data.steps:
        if step.get("phase", "TRAIN") == "TRAIN":
            by_rank[int(step.get("rank", 0))].append(step)
    if not by_rank:
        result.detail = "no training steps recorded"
        return result
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    threshold = float(p["threshold"])
    ranks: list[dict[str, Any]] = []
    notes = []
    for rank, steps in sorted(by_rank.items()):
        steps.sort(key=lambda s: float(s["start"]))
        patience, window, scaled = _scale(len(steps), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(steps), patience, window))
        if len(steps) < MIN_SAMPLES:
            continue
        stamps = [float(s["start"]) for s in steps]
        stall = np.array(
            [float(s["data_wait"]) / float(s["duration"]) if float(s["duration"]) > 0 else 0.0 for s in steps]
        )
        median = 0.0
        triggered = 0
        for end in _scan_ends(stamps, interval):
            n = bisect.bisect_right(stamps, end)
            if n <= patience:
                continue
            median = float(np.median(stall[:n][-window:]))
            if median > threshold:
                triggered += 1
        result.trigger_count += triggered
        ranks.append(
            {
                "rank": rank,
                "host": steps[-1].get("node"),
                "median_stall_fraction": median,
                "steps": len(steps),
                "triggered": triggered,
                "window_steps": [int(steps[max(0, len(steps) - window)].get("step", 0)), int(steps[-1].get("step", 0))],
            }
        )
    result.violations, result.datapoints = result.trigger_count, sum(map(len, by_rank.values()))
    result.detail = "; ".join(sorted(set(notes))) or None
    result.evidence = {"ranks": ranks, "loader": data.loader}
    if result.trigger_count:
        result.status = STATUS_ISSUES
        worst = max(ranks, key=lambda r: r["median_stall_fraction"])
        loader = _loader_words(data.loader)
        result.recommendation = (
            f"The model waited for data {100 * worst['median_stall_fraction']:.0f} % of each step "
            f"(median, rank {worst['rank']} on {worst['host']}; limit {100 * threshold:.0f} %): "
            f"the data loader{loader} cannot keep up. Raise the data-loader workers (--workers) "
            "or decode faster (a faster --decoder, lighter augmentation, smaller stored images)."
        )
    return result


def _loader_words(loader: Mapping[str, Any]) -> str:
    parts = []
    if "workers" in loader:
        parts.append(f"{loader['workers']} workers")
    if loader.get("decoder"):
        parts.append(f"decoder {loader['decoder']}")
    return f" ({', '.join(parts)})" if parts else ""


def loss_not_decreasing(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("LossNotDecreasing", STATUS_OK, parameters=_params(p))
    mode = p.get("mode") or "TRAIN"
    per_step: dict[int, list[float]] = defaultdict(list)
    for step in data.steps:
        loss = step.get("loss")
        if step.get("phase", "TRAIN") == mode and loss is not None:
            per_step[int(step["step"])].append(float(loss))
    if not per_step:
        result.detail = f"no {mode} losses recorded"
        return result
    steps = sorted(per_step)
    losses = [sum(per_step[s]) / len(per_step[s]) for s in steps]
    num_steps, _, scaled = _scale(len(losses), int(p["num_steps"]))
    if scaled:
        result.detail = _scaled_note(len(losses), num_steps, None, "num_steps")
    if len(losses) < MIN_SAMPLES:
        return result
    checks = []
    for start in range(0, len(losses) - num_steps + 1, num_steps):
        chunk = losses[start : start + num_steps]
        checks.append((steps[start + num_steps - 1], sum(chunk) / len(chunk)))
    found: list[dict[str, Any]] = []
    lowest = math.inf
    for index, (at_step, loss) in enumerate(checks):
        if index:
            previous = checks[index - 1][1]
            if not math.isfinite(loss):
                bad = True
            elif loss > previous:
                bad = loss > lowest * (1 + float(p["increase_threshold_percent"]) / 100)
            else:
                bad = previous - loss < float(p["diff_percent"]) / 100 * abs(previous)
            if bad:
                found.append({"step": at_step, "loss": loss, "previous": previous, "lowest": lowest})
        lowest = min(lowest, loss)
    result.trigger_count = result.violations = len(found)
    result.datapoints = len(checks)
    result.evidence = {"checks": len(checks), "violations": _cut(found)}
    if found:
        result.status = STATUS_ISSUES
        first = found[0]
        result.recommendation = (
            f"The training loss stopped going down: at step {first['step']} its mean over the "
            f"last {num_steps} steps was {first['loss']:.4g}, above the lowest so far "
            f"({first['lowest']:.4g}) by more than {p['increase_threshold_percent']} %. Lower the "
            "learning rate, check the labels of newly added data, or stop early."
        )
    return result


# --- host and job rules -------------------------------------------------------------------------


def dataloader(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("Dataloader", STATUS_OK, parameters=_params(p))
    workers = _series(data.system, "DataLoaderWorkers")
    if not workers:
        result.detail = "no data-loader process counts recorded (psutil not available)"
        return result
    cores_by_node: dict[str, set[str]] = defaultdict(set)
    for record in data.system:
        if record.get("Dimension") == "CPUUtilization":
            cores_by_node[str(record["NodeId"])].add(str(record["Name"]))
    worker_cpu = _series(data.system, "DataLoaderWorkersCPUUtilization")
    trainers = {
        node: dict(zip(t.tolist(), v.tolist(), strict=True))
        for (node, _), (t, v) in _series(data.system, "TrainingProcesses").items()
    }
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    hosts: list[dict[str, Any]] = []
    notes = []
    for (node, _), (stamps, values) in workers.items():
        # Per whole second, the most loading processes seen in it (Debugger: distinct PIDs per
        # second): workers, plus the training processes iterating the loader.
        per_second: dict[int, float] = {}
        iterating = trainers.get(node, {})
        for stamp, value in zip(stamps.tolist(), values.tolist(), strict=True):
            second = int(stamp)
            count = float(value) + float(iterating.get(stamp, 0.0))
            per_second[second] = max(per_second.get(second, 0.0), count)
        seconds = sorted(per_second)
        patience, _, scaled = _scale(len(seconds), int(p["patience"]))
        if scaled:
            notes.append(_scaled_note(len(seconds), patience, None))
        cores = len(cores_by_node.get(node, set())) or 1
        low, high = cores * float(p["min_threshold"]) / 100, cores * float(p["max_threshold"]) / 100
        median = 0.0
        for end in _scan_ends([float(s) for s in seconds], interval):
            n = bisect.bisect_right(seconds, end)
            if n <= patience or len(seconds) < MIN_SAMPLES:
                continue
            median = float(np.median([per_second[s] for s in seconds[:n]]))
            if median < low or median > high:
                result.trigger_count += 1
        cpu = worker_cpu.get((node, "dataloader"))
        entry: dict[str, Any] = {
            "host": node,
            "cores": cores,
            "median_workers": median,
            "min_workers": low,
            "max_workers": high,
            "worker_cpu_p50": _q(cpu[1], 0.5) if cpu is not None and len(cpu[1]) else None,
        }
        hosts.append(entry)
        if median < low or median > high:
            found.append(entry)
    result.violations, result.datapoints = (
        result.trigger_count,
        sum(len(v) for _, v in workers.values()),
    )
    result.detail = "; ".join(sorted(set(notes))) or None
    result.evidence = {"hosts": hosts}
    if result.trigger_count and found:
        result.status = STATUS_ISSUES
        entry = found[0]
        if entry["median_workers"] < entry["min_workers"]:
            result.recommendation = (
                f"{entry['host']} ran {entry['median_workers']:.0f} data-loading processes "
                f"for {entry['cores']} cores (fewer than {p['min_threshold']} % of the cores): "
                "raise --workers so decoding runs beside training."
            )
        else:
            result.recommendation = (
                f"{entry['host']} ran {entry['median_workers']:.0f} data-loading processes "
                f"for {entry['cores']} cores (more than {p['max_threshold']} % of the cores): "
                "lower --workers; they compete with training for the CPUs."
            )
    return result


def max_initialization_time(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    result = RuleEvaluation("MaxInitializationTime", STATUS_OK, parameters=_params(p))
    stamps = [float(r["Timestamp"]) for r in data.system]
    first = data.started_at if data.started_at is not None else min(stamps, default=None)
    if first is None:
        result.detail = "no timeline: neither a start time nor system samples"
        return result
    last = data.now if data.now is not None else max(stamps, default=first)
    starts = [float(s["start"]) for s in data.steps]
    limit = float(p["threshold"]) * 60
    first_step = min(starts, default=None)
    waited = (first_step if first_step is not None else last) - first
    result.datapoints = len(starts)
    result.evidence = {
        "initialization_seconds": waited,
        "first_step_seen": first_step is not None,
    }
    if waited > limit:
        result.status = STATUS_ISSUES
        result.trigger_count = result.violations = 1
        result.recommendation = (
            f"The first step came {waited / 60:.1f} minutes after the job started (limit "
            f"{p['threshold']} minutes)"
            + ("" if first_step is not None else "; no step has run yet")
            + ": look at the log for slow dataset listing, downloads or a hanging rendezvous."
        )
    return result


def overall_system_usage(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:
    result = RuleEvaluation("OverallSystemUsage", STATUS_OK, parameters=_params(p))
    grouped: dict[tuple[str, str], list[float]] = defaultdict(list)
    for record in data.system:
        grouped[(str(record["NodeId"]), str(record["Dimension"]))].append(float(record["Value"]))
    usage: dict[str, dict[str, Any]] = defaultdict(dict)
    for (node, dimension), values in sorted(grouped.items()):
        array = np.array(values)
        usage[node][dimension] = {
            "p50": _q(array, 0.5),
            "p95": _q(array, 0.95),
            "p99": _q(array, 0.99),
            "max": float(array.max()),
        }
    result.datapoints = len(data.system)
    result.evidence = {"hosts": dict(usage)}
    result.detail = "a summary of the system metrics; this rule never triggers"
    return result


RULES: dict[str, Callable[[ProfileData, Mapping[str, Any]], RuleEvaluation]] = {
    "LowGPUUtilization": low_gpu_utilization,
    "CPUBottleneck": cpu_bottleneck,
    "IOBottleneck": io_bottleneck,
    "StepOutlier": step_outlier,
    "BatchSize": batch_size,
    "Dataloader": dataloader,
    "GPUMemoryIncrease": gpu_memory_increase,
    "LoadBalancing": load_balancing,
    "MaxInitializationTime": max_initialization_time,
    "OverallSystemUsage": overall_system_usage,
    "LossNotDecreasing": loss_not_decreasing,
    "DataStall": data_stall,
}


def parameters_for(name: str, overrides: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """A rule's defaults with this run's overrides; an unknown parameter is refused by name."""
    values = dict(DEFAULTS[name])
    for key, value in (overrides or {}).get(name, {}).items():
        if key not in values and key != "scan_interval_s":
            known = ", ".join(sorted(values)) or "none"
            raise ValueError(f"{name} has no parameter {key!r} (it has: {known})")
        values[key] = value
    return values


def evaluate(
    data: ProfileData,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    names: Sequence[str] | None = None,
) -> list[RuleEvaluation]:
    """Every rule (or those named) on `data`; a rule that fails is an `Error`, not an exception."""
    unknown = sorted(set(names or ()) - set(RULES) | set(overrides or {}) - set(RULES))
    if unknown:
        raise ValueError(f"unknown rules {unknown}; known: {', '.join(RULES)}")
    results = []
    for name in names or RULES:
        parameters = parameters_for(name, overrides)
        try:
            results.append(RULES[name](data, parameters))
        except Exception as error:  # a rule's bug must not hide the other verdicts
            results.append(
                RuleEvaluation(
                    name,
                    STATUS_ERROR,
                    parameters=_params(parameters),
                    detail=f"{type(error).__name__}: {error}",
                )
            )
    return results
