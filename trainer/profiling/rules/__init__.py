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

The package, one module per family: `common.py` (inputs, verdict, defaults, helpers), `gpu.py`
(the GPU rules), `step_times.py` (StepOutlier, DataStall), `loss.py` (LossNotDecreasing) and
`host.py` (Dataloader, MaxInitializationTime, OverallSystemUsage); here `RULES`, `evaluate` and
`parameters_for`, and the names the rest of the trainer imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer.profiling.rules.common import (
    DEFAULTS,
    RULE_NAMES,
    SCAN_INTERVAL_SECONDS,
    STATUS_ERROR,
    STATUS_ISSUES,
    STATUS_OK,
    ProfileData,
    RuleEvaluation,
    _params,
)
from trainer.profiling.rules.gpu import (
    batch_size,
    cpu_bottleneck,
    gpu_memory_increase,
    io_bottleneck,
    load_balancing,
    low_gpu_utilization,
)
from trainer.profiling.rules.host import dataloader, max_initialization_time, overall_system_usage
from trainer.profiling.rules.loss import loss_not_decreasing
from trainer.profiling.rules.step_times import data_stall, step_outlier

__all__ = [
    "DEFAULTS",
    "RULES",
    "RULE_NAMES",
    "SCAN_INTERVAL_SECONDS",
    "STATUS_ERROR",
    "STATUS_ISSUES",
    "STATUS_OK",
    "ProfileData",
    "RuleEvaluation",
    "evaluate",
    "parameters_for",
]

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
