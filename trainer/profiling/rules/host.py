"""The host and job rules: Dataloader (loading processes per core), MaxInitializationTime (the wait
for the first step) and OverallSystemUsage (a summary of the system metrics, never triggered).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.profiling.rules.common import (
    MIN_SAMPLES,
    SCAN_INTERVAL_SECONDS,
    STATUS_ISSUES,
    STATUS_OK,
    ProfileData,
    RuleEvaluation,
    _params,
    _q,
    _scale,
    _scaled_note,
    _scan_ends,
    _too_few,
)


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
