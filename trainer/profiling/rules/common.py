"""What every rule shares: the inputs (`ProfileData`), the verdict (`RuleEvaluation`), the defaults
of every rule (`DEFAULTS`, Debugger's), and the helpers for short runs, scans and evidence.

The helpers keep their leading underscore: they are the rule modules' own, not the package's API.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
