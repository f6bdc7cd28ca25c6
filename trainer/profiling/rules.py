"""SageMaker Debugger's built-in profiler rules, evaluated on our own samples; pure functions.

The inputs are what the trainer writes, Debugger-format system records (`monitor.py`) and
per-rank step lines (`steps.py`), in the columns `store.ProfileStore` holds them in. Each rule
follows the definition and the defaults of Debugger's rule (smdebug
`profiler/analysis/rules/*.py` and the SDK's rulesconfig), including how it is invoked: every
`scan_interval_s` (60 s) of timeline, on everything seen so far, each scan where the condition
holds counting as a trigger (Debugger's `RuleTriggered`).

Short runs: where a rule has fewer samples than its `patience` (or `window`), it would never
judge; it is then evaluated with patience and window both scaled to 20 % of the samples
available (never above their configured values), and the result's `detail` says so.

Rules that cannot judge: a rule without its input (no GPU series on a CPU host, one GPU for
LoadBalancing, fewer than `MIN_SAMPLES` samples, no losses, a run too short for
LossNotDecreasing's windows) keeps Debugger's status NoIssuesFound, as a Debugger rule job would
report, and says `applicable: false` with a `not_applicable_reason`: NoIssuesFound is then no
pass, and the report and the notification say "not applicable on this host" instead.

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
  check is the mean training loss (averaged over ranks) of the last `window` steps, not one
  step's value. `window` is `num_steps`, or longer when the run's per-step loss is too noisy for
  a `num_steps` mean to tell a rise of `increase_threshold_percent` from chance (small batches):
  then as many steps as make that rise four standard errors of the mean (see
  `loss_not_decreasing`). Semantics followed: every `num_steps` steps, if the loss went up, it is
  a violation only when it exceeds the lowest loss seen so far by more than
  `increase_threshold_percent`; if it went down, a violation when it went down by less than
  `diff_percent` of the previous value (0: never, so a loss that stays flat fires only with a
  `diff_percent` above 0, as in Debugger).
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
from pathlib import Path
from typing import Any

import numpy as np

from trainer.profiling.store import ProfileStore, StepColumns, SystemColumns

SHORT_RUN_FRACTION = 0.2
SCAN_INTERVAL_SECONDS = 60.0
# Below this many samples no rule judges at all: a percentile of 3 values says nothing.
MIN_SAMPLES = 5
# Evidence lists are cut to this many items, with a count of the rest.
MAX_EVIDENCE_ITEMS = 20
# LossNotDecreasing: a rise of increase_threshold_percent is this many standard errors of a
# window's mean loss (the window is sized to the run's noise; see `loss_not_decreasing`).
NOISE_STANDARD_ERRORS = 4

STATUS_OK, STATUS_ISSUES, STATUS_ERROR = "NoIssuesFound", "IssuesFound", "Error"
STOP_NOTE = "this rule stopped the training (--stop-on-rule)"

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

    # What `store.ProfileStore` read from `profile/`: columns, not one dict per record.
    system: SystemColumns = field(default_factory=SystemColumns)
    steps: StepColumns = field(default_factory=StepColumns)
    # When the job started and the newest moment seen (epoch seconds); from the data if None.
    started_at: float | None = None
    now: float | None = None
    # The data loader's settings (workers, decoder, ...), named in DataStall's advice.
    loader: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, *profile_dirs: Path, **fields: Any) -> ProfileData:
        """Everything under these `profile/` folders now (the online evaluator keeps its
        `ProfileStore` instead, to read only what is appended); `fields` as the class takes them."""
        held = ProfileStore(*profile_dirs)
        held.refresh()
        return cls(system=held.system, steps=held.steps, **fields)


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
    # False when the rule had nothing to judge on this host (no GPU series, one GPU, too few
    # steps, no loss): the status stays Debugger's NoIssuesFound, which is no pass then.
    applicable: bool = True
    not_applicable_reason: str | None = None

    def not_applicable(self, reason: str) -> RuleEvaluation:
        """Nothing to judge: NoIssuesFound in Debugger's vocabulary, but no verdict; says why."""
        self.status, self.applicable, self.not_applicable_reason = STATUS_OK, False, reason
        self.detail = reason
        return self

    def stopped_training(self) -> None:
        """This rule stopped the run (`--stop-on-rule`): its evidence and detail say so."""
        self.evidence["stopped_training"] = True
        self.detail = f"{self.detail}; {STOP_NOTE}" if self.detail else STOP_NOTE

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "applicable": self.applicable,
            "not_applicable_reason": self.not_applicable_reason,
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


def _snapshot_flags(
    system: SystemColumns, dimension: str, gpu_threshold: float, threshold: float
) -> dict[str, tuple[list[float], list[bool]]]:
    """Per node: each snapshot's time, and whether in it a GPU was below `gpu_threshold` while a
    `dimension` record was above `threshold` (CPUBottleneck, IOBottleneck)."""
    result: dict[str, tuple[list[float], list[bool]]] = {}
    for node, stats in system.per_snapshot(("GPUUtilization", dimension)).items():
        flags = (stats.min["GPUUtilization"] < gpu_threshold) & (stats.max[dimension] > threshold)
        result[node] = (stats.stamps, flags.tolist())
    return result


def _snapshot_means(system: SystemColumns, dimension: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per node: the time and the mean `dimension` value of each snapshot that has one."""
    result: dict[str, tuple[list[float], list[float]]] = {}
    for node, stats in system.per_snapshot((dimension,)).items():
        has = stats.count[dimension] > 0
        means = stats.sum[dimension][has] / stats.count[dimension][has]
        result[node] = (np.asarray(stats.stamps)[has].tolist(), means.tolist())
    return result


def _params(values: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in values.items()}


def _q(values: Any, quantile: float) -> float:
    return float(np.quantile(values, quantile))


def _pct(value: float) -> str:
    return f"{value:.0f} %"


NO_GPU = "no GPU metrics on this run (a CPU host, or no NVML/nvidia-smi)"


def _too_few(what: str, n: int) -> str:
    return f"only {n} {what}: too few to judge (at least {MIN_SAMPLES})"


# --- the GPU rules ------------------------------------------------------------------------------


def low_gpu_utilization(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("LowGPUUtilization", STATUS_OK, parameters=_params(p))
    series = data.system.series("GPUUtilization")
    if not series:
        return result.not_applicable(NO_GPU)
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    judged = False
    for (node, gpu), (stamps, values) in series.items():
        datapoints = max(datapoints, len(values))
        patience, window, scaled = _scale(len(values), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(values), patience, window))
        if len(values) < MIN_SAMPLES:
            continue
        judged = True
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
    if not judged:
        return result.not_applicable(_too_few("GPU utilization samples per GPU", datapoints))
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
    if not data.system.has("GPUUtilization"):
        return result.not_applicable(NO_GPU)
    if not data.system.has(dimension):
        return result.not_applicable(f"no {dimension} samples on this host")
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    evidence: list[dict[str, Any]] = []
    notes = []
    total_points = 0
    judged = False
    flagged = _snapshot_flags(data.system, dimension, float(p["gpu_threshold"]), float(p[key]))
    for node, (stamps, flags) in flagged.items():
        total_points += len(flags)
        patience, _, scaled = _scale(len(flags), int(p["patience"]))
        if scaled:
            notes.append(_scaled_note(len(flags), patience, None))
        if len(flags) < MIN_SAMPLES:
            continue
        judged = True
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
    if not judged:
        return result.not_applicable(_too_few("snapshots per host", total_points))
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
    gpu_util = data.system.series("GPUUtilization")
    if not gpu_util:
        return result.not_applicable(NO_GPU)
    gpu_memory = data.system.series("GPUMemoryUtilization")
    if not gpu_memory:
        return result.not_applicable("no GPU memory samples on this run (nvidia-smi or NVML did not report them)")
    if not data.system.has("CPUUtilization"):
        return result.not_applicable("no CPUUtilization samples on this host")
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    judged = False
    for node, (cpu_stamps, cpu_total) in _snapshot_means(data.system, "CPUUtilization").items():
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
                judged = True
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
    if not judged:
        return result.not_applicable(
            f"only {datapoints} snapshots per host: too few for a window of GPU and CPU samples"
        )
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
    series = data.system.series("GPUMemoryUtilization")
    if not series:
        return result.not_applicable(NO_GPU)
    found: list[dict[str, Any]] = []
    notes = []
    datapoints = 0
    judged = False
    for (node, gpu), (_, values) in series.items():
        datapoints = max(datapoints, len(values))
        patience, window, scaled = _scale(len(values), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(values), patience, window))
        if len(values) < MIN_SAMPLES or len(values) <= window + 1:
            continue
        judged = True
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
    if not judged:
        return result.not_applicable(_too_few("GPU memory samples per GPU", datapoints))
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
    series = data.system.series("GPUUtilization")
    if not series:
        return result.not_applicable(NO_GPU)
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    # 0, 2, ..., 100: a saturated GPU's 100 % is counted (divergence: see the module docstring).
    edges = np.arange(0, 101, 2)
    found: list[dict[str, Any]] = []
    notes = []
    by_node: dict[str, list[tuple[str, Any, Any]]] = defaultdict(list)
    for (node, gpu), (stamps, values) in series.items():
        by_node[node].append((gpu, stamps, values))
    if all(len(gpus) < 2 for gpus in by_node.values()):
        return result.not_applicable("one GPU per host: LoadBalancing compares the GPUs of a host with each other")
    judged = False
    for node, gpus in by_node.items():
        for i, (gpu_a, stamps_a, values_a) in enumerate(gpus):
            patience, _, scaled = _scale(len(values_a), int(p["patience"]))
            if scaled:
                notes.append(_scaled_note(len(values_a), patience, None))
            if len(values_a) < MIN_SAMPLES:
                continue
            for gpu_b, stamps_b, values_b in gpus[i + 1 :]:
                judged = True
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
    if not judged:
        return result.not_applicable(_too_few("GPU utilization samples per GPU", result.datapoints))
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
    grouped = data.steps.groups(
        lambda s: (str(s.get("node", "")), str(s.get("phase", "TRAIN"))),
        lambda s: mode in (None, "None", "") or s.get("phase") == mode,
    )
    if not grouped:
        phase = "" if mode in (None, "None", "") else f" in phase {mode}"
        return result.not_applicable(f"no steps recorded{phase}")
    found: list[dict[str, Any]] = []
    notes = []
    judged = False
    for (node, phase), steps in sorted(grouped.items()):
        needed, _, scaled = _scale(len(steps), int(p["n_steps"]))
        if scaled:
            notes.append(_scaled_note(len(steps), needed, None, "n_steps"))
        if len(steps) < MIN_SAMPLES:
            continue
        judged = True
        stamps = steps.start.tolist()
        durations = steps.duration
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
                        {"rank": steps.get(i, "rank"), "step": steps.get(i, "step"), "seconds": float(durations[i])}
                        for i in outliers[:MAX_EVIDENCE_ITEMS]
                    ],
                }
        if last is not None:
            found.append(last)
    result.violations = result.trigger_count
    result.datapoints = len(data.steps)
    if not judged:
        return result.not_applicable(_too_few("steps per host and phase", max(map(len, grouped.values()))))
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
    by_rank = data.steps.groups(lambda s: int(s.get("rank", 0)), lambda s: s.get("phase", "TRAIN") == "TRAIN")
    if not by_rank:
        return result.not_applicable("no training steps recorded")
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    threshold = float(p["threshold"])
    ranks: list[dict[str, Any]] = []
    notes = []
    judged = False
    for rank, steps in sorted(by_rank.items()):
        patience, window, scaled = _scale(len(steps), int(p["patience"]), int(p["window"]))
        assert window is not None
        if scaled:
            notes.append(_scaled_note(len(steps), patience, window))
        if len(steps) < MIN_SAMPLES:
            continue
        judged = True
        stamps = steps.start.tolist()
        stall = np.divide(steps.data_wait, steps.duration, out=np.zeros(len(steps)), where=steps.duration > 0)
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
                "host": steps.get(len(steps) - 1, "node"),
                "median_stall_fraction": median,
                "steps": len(steps),
                "triggered": triggered,
                "window_steps": [
                    int(steps.get(max(0, len(steps) - window), "step", 0)),
                    int(steps.get(len(steps) - 1, "step", 0)),
                ],
            }
        )
    result.violations, result.datapoints = result.trigger_count, sum(map(len, by_rank.values()))
    if not judged:
        return result.not_applicable(_too_few("training steps per rank", max(map(len, by_rank.values()))))
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


def _relative_noise(losses: Sequence[float]) -> float:
    """The per-step loss's scatter, as a fraction of the loss; a trend and a few odd steps aside.

    From the differences of consecutive steps relative to their loss (a trend moves two
    neighbouring steps little), their median absolute deviation (a few hard batches count little)
    times 1.4826 (a standard deviation, for normal noise), over sqrt(2) (a difference holds the
    noise of two steps).
    """
    values = np.array([value for value in losses if math.isfinite(value)], dtype=float)
    if len(values) < 3:
        return 0.0
    level = (np.abs(values[1:]) + np.abs(values[:-1])) / 2
    keep = level > 0
    if not keep.any():
        return 0.0
    relative = np.diff(values)[keep] / level[keep]
    deviation = float(np.median(np.abs(relative - np.median(relative))))
    return 1.4826 * deviation / math.sqrt(2)


def loss_not_decreasing(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912, PLR0915
    """Every `num_steps` steps, the mean loss of the last `window` steps against the previous
    check and the lowest so far (Debugger's semantics; see the module docstring).

    Why `window` may be longer than `num_steps`: Debugger's 10 steps assume a loss whose 10-step
    mean is steady to well within `increase_threshold_percent`, as with large batches. With small
    batches (the offline demo: 4 images a step) one step's loss scatters by about 10 %, a 10-step
    mean by about 3 %, and the lowest of a run's many such means sits a few standard errors below
    the trend: a healthy, falling loss then rises "5 % above the lowest" by chance alone. So the
    window is sized to the run's own noise: as many steps as make the standard error of its mean
    at most a quarter of `increase_threshold_percent` (a real rise of that size is four standard
    errors), and never fewer than `num_steps`. A loss as steady as Debugger assumes keeps
    `num_steps`; a run too short for two checks of such windows is not judged (not applicable).
    The checks stay every `num_steps` steps (a stopping rule reacts as soon as Debugger's would).
    """
    result = RuleEvaluation("LossNotDecreasing", STATUS_OK, parameters=_params(p))
    mode = p.get("mode") or "TRAIN"
    # Per step number, every rank's loss, in file order: a float sum depends on its order.
    per_step: dict[int, list[float]] = defaultdict(list)
    for chosen in data.steps.groups(lambda s: mode, lambda s: s.get("phase", "TRAIN") == mode, by_start=False).values():
        has = chosen.column("has_loss")
        for step, loss in zip(chosen.column("step")[has].tolist(), chosen.column("loss")[has].tolist(), strict=True):
            per_step[int(step)].append(loss)
    if not per_step:
        return result.not_applicable(f"no {mode} losses recorded")
    steps = sorted(per_step)
    losses = [sum(per_step[s]) / len(per_step[s]) for s in steps]
    n = len(losses)
    result.datapoints = n
    if n < MIN_SAMPLES:
        return result.not_applicable(_too_few(f"{mode} losses", n))
    num_steps, _, scaled = _scale(n, int(p["num_steps"]))
    threshold = float(p["increase_threshold_percent"]) / 100
    noise = _relative_noise(losses)
    window = num_steps
    if threshold > 0 and noise > 0:
        window = max(num_steps, math.ceil((NOISE_STANDARD_ERRORS * noise / threshold) ** 2))
    # Debugger's cadence: a check every num_steps steps, the first once a window is full.
    first = math.ceil(window / num_steps) * num_steps
    if n < first + num_steps:
        return result.not_applicable(
            f"only {n} {mode} steps: one step's loss scatters by {100 * noise:.0f} %, so telling a "
            f"rise of {p['increase_threshold_percent']} % from noise takes means over {window} steps, "
            f"compared every {num_steps} steps ({first + num_steps} steps at least)"
        )
    notes = []
    if scaled:
        notes.append(_scaled_note(n, num_steps, None, "num_steps"))
    if window > num_steps:
        notes.append(
            f"one step's loss scatters by {100 * noise:.0f} % (small batches): each check compares "
            f"the mean of the last {window} steps, not {num_steps}, so that a rise of "
            f"{p['increase_threshold_percent']} % is {NOISE_STANDARD_ERRORS} standard errors of it"
        )
    checks = []
    for end in range(first, n + 1, num_steps):
        chunk = losses[end - window : end]
        checks.append((steps[end - 1], sum(chunk) / len(chunk)))
    found: list[dict[str, Any]] = []
    lowest = math.inf
    for index, (at_step, loss) in enumerate(checks):
        if index:
            previous = checks[index - 1][1]
            if not math.isfinite(loss):
                bad = True
            elif loss > previous:
                bad = loss > lowest * (1 + threshold)
            else:
                bad = previous - loss < float(p["diff_percent"]) / 100 * abs(previous)
            if bad:
                found.append({"step": at_step, "loss": loss, "previous": previous, "lowest": lowest})
        lowest = min(lowest, loss)
    result.trigger_count = result.violations = len(found)
    result.detail = "; ".join(notes) or None
    result.evidence = {
        "checks": len(checks),
        "window_steps": window,
        "every_steps": num_steps,
        "step_noise_percent": 100 * noise,
        "first": {"step": checks[0][0], "loss": checks[0][1]},
        "last": {"step": checks[-1][0], "loss": checks[-1][1]},
        "lowest": lowest,
        "violations": _cut(found),
    }
    if found:
        result.status = STATUS_ISSUES
        first_found = found[0]
        if not math.isfinite(first_found["loss"]):
            what = "not a finite number: the training diverged"
        elif first_found["loss"] > first_found["previous"]:
            what = (
                f"above the lowest so far ({first_found['lowest']:.4g}) by more than "
                f"{p['increase_threshold_percent']} %"
            )
        else:
            what = f"down from {first_found['previous']:.4g} by less than {p['diff_percent']} % in {num_steps} steps"
        result.recommendation = (
            f"The training loss stopped going down: at step {first_found['step']} its mean over the "
            f"last {window} steps was {first_found['loss']:.4g}, {what}. Lower the learning rate, "
            "check the labels of newly added data, or stop early."
        )
    return result


# --- host and job rules -------------------------------------------------------------------------


def dataloader(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912
    result = RuleEvaluation("Dataloader", STATUS_OK, parameters=_params(p))
    workers = data.system.series("DataLoaderWorkers")
    if not workers:
        return result.not_applicable("no data-loader process counts recorded (psutil not available)")
    cores_by_node = data.system.names("CPUUtilization")
    worker_cpu = data.system.series("DataLoaderWorkersCPUUtilization")
    trainers = {
        node: dict(zip(t.tolist(), v.tolist(), strict=True))
        for (node, _), (t, v) in data.system.series("TrainingProcesses").items()
    }
    interval = float(p.get("scan_interval_s", SCAN_INTERVAL_SECONDS))
    found: list[dict[str, Any]] = []
    hosts: list[dict[str, Any]] = []
    notes = []
    judged = False
    most_seconds = 0
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
        most_seconds = max(most_seconds, len(seconds))
        patience, _, scaled = _scale(len(seconds), int(p["patience"]))
        if scaled:
            notes.append(_scaled_note(len(seconds), patience, None))
        cores = len(cores_by_node.get(node, set())) or 1
        low, high = cores * float(p["min_threshold"]) / 100, cores * float(p["max_threshold"]) / 100
        median = 0.0
        if len(seconds) < MIN_SAMPLES:
            continue
        judged = True
        for end in _scan_ends([float(s) for s in seconds], interval):
            n = bisect.bisect_right(seconds, end)
            if n <= patience:
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
    if not judged:
        return result.not_applicable(_too_few("seconds of data-loader samples per host", most_seconds))
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
    span = data.system.time_range()
    first = data.started_at if data.started_at is not None else (span[0] if span else None)
    if first is None:
        return result.not_applicable("no timeline: neither a start time nor system samples")
    last = data.now if data.now is not None else (span[1] if span else first)
    starts = data.steps.column("start")
    limit = float(p["threshold"]) * 60
    first_step = float(starts.min()) if len(starts) else None
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
    if not data.system:
        return result.not_applicable("no system samples recorded")
    usage: dict[str, dict[str, Any]] = defaultdict(dict)
    for (node, dimension), array in data.system.values().items():
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
