"""The rules on the step lines' timings: StepOutlier (steps far slower than the rest, per node and
phase) and DataStall (our own: the share of each step spent waiting for data, per rank).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.profiling.rules.common import (
    MAX_EVIDENCE_ITEMS,
    MIN_SAMPLES,
    SCAN_INTERVAL_SECONDS,
    STATUS_ISSUES,
    STATUS_OK,
    ProfileData,
    RuleEvaluation,
    _params,
    _scale,
    _scaled_note,
    _scan_ends,
    _too_few,
)


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
