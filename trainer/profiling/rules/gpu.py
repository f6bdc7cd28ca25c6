"""The GPU rules: LowGPUUtilization, CPUBottleneck and IOBottleneck, BatchSize, GPUMemoryIncrease,
LoadBalancing. Each needs the GPU series of the system samples, and is not applicable without.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.profiling.rules.common import (
    MIN_SAMPLES,
    NO_GPU,
    SCAN_INTERVAL_SECONDS,
    STATUS_ISSUES,
    STATUS_OK,
    ProfileData,
    RuleEvaluation,
    _cut,
    _params,
    _pct,
    _q,
    _scale,
    _scaled_note,
    _scan_ends,
    _snapshot_flags,
    _snapshot_means,
    _too_few,
    _upto,
)


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
        # of the last `window` minus the one a sample earlier (see the package's divergences).
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
    # 0, 2, ..., 100: a saturated GPU's 100 % is counted (divergence: see the package docstring).
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
