"""`rules.json` and `report.html`: what the functions read, and what an engineer opens.

`rules.json` has the shape of `functions.common.rules.RulesFile` (schema_version 1, backend
"builtin"): the trainer imports nothing from there, it writes the same plain JSON, and a test
validates real output against the model.

`report.html` is one self-contained file (no script, no external CSS, no network): the rule
table with evidence and recommendations, CPU and GPU utilization heatmaps (cores and GPUs x
time, one table cell per time bin), per-rank step timelines with data wait / compute /
communication stacked (inline SVG), the per-rank load balance, training curves and the run's
lineage when `metrics.json` is given.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from trainer.profiling.rules import ProfileData, RuleEvaluation
from trainer.profiling.store import StepArrays, StepColumns, SystemColumns
from trainer.screening import report as data_report

RULES_FILE = "rules.json"
REPORT_FILE = "report.html"
# Heatmap and timeline resolution: enough to see phases, small enough for any browser.
MAX_COLUMNS = 120
MAX_BARS = 200


def rules_document(
    results: Sequence[RuleEvaluation],
    *,
    job_name: str | None = None,
    generated_at: datetime | None = None,
) -> dict[str, Any]:
    """The `RulesFile` shape, as plain JSON."""
    return {
        "schema_version": 1,
        "backend": "builtin",
        "job_name": job_name,
        "generated_at": (generated_at or datetime.now(UTC)).isoformat(),
        "report_uri": None,
        "rules": [result.to_dict() for result in results],
    }


def write_outputs(
    out_dir: Path,
    data: ProfileData,
    results: Sequence[RuleEvaluation],
    *,
    job_name: str | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """`rules.json` and `report.html` in `out_dir`, each written whole (beside, then renamed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rules_path, report_path = out_dir / RULES_FILE, out_dir / REPORT_FILE
    document = rules_document(results, job_name=job_name)
    write_atomic(rules_path, json.dumps(document, indent=2) + "\n")
    new_data = data_report.section(out_dir, metrics)
    write_atomic(report_path, render_html(data, results, job_name=job_name, metrics=metrics, new_data=new_data))
    return rules_path, report_path


def write_atomic(path: Path, text: str) -> None:
    """`path` written whole: a reader (a browser, the uploader) never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


# --- HTML ---------------------------------------------------------------------------------------

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1200px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #dde;
padding-bottom:4px}h3{font-size:14px;margin:16px 0 6px}
.sub{color:#667;margin-top:0}table{border-collapse:collapse}
table.rules td,table.rules th,table.kv td,table.kv th,table.ranks td,table.ranks th{
border-bottom:1px solid #e4e6ee;padding:6px 8px;text-align:left;vertical-align:top}
.IssuesFound{color:#fff;background:#c62828}.NoIssuesFound{color:#fff;background:#2e7d32}
.Error{color:#fff;background:#6d4c41}.badge{padding:2px 8px;border-radius:10px;font-size:12px;
white-space:nowrap}.NotApplicable{color:#fff;background:#757575}
details summary{cursor:pointer;color:#345}pre{font-size:12px;
background:#f5f6fa;padding:8px;overflow:auto;max-height:280px}
table.heat{table-layout:fixed}table.heat td{width:7px;height:12px;padding:0}
table.heat th{font-weight:normal;font-size:11px;color:#556;padding-right:6px;text-align:right;
white-space:nowrap}.legend span{display:inline-block;width:18px;height:10px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #e4e6ee;border-radius:8px;
padding:10px 14px;min-width:150px}.card b{display:block;font-size:20px}.muted{color:#778}
svg text{font:11px system-ui,sans-serif;fill:#445}
"""

WAIT, COMPUTE, COMMUNICATION = "#e53935", "#1e88e5", "#fb8c00"


def _e(value: Any) -> str:
    return html.escape(str(value))


def _color(value: float) -> str:
    """0 % white-blue to 100 % dark red: a sequential scale readable in print."""
    v = max(0.0, min(100.0, value)) / 100.0
    stops = [
        (0.0, (247, 251, 255)),
        (0.35, (107, 174, 214)),
        (0.7, (253, 174, 97)),
        (1.0, (165, 0, 38)),
    ]
    for (x0, c0), (x1, c1) in itertools.pairwise(stops):
        if v <= x1:
            t = (v - x0) / (x1 - x0)
            r, g, b = (round(a + (b_ - a) * t) for a, b_ in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#a50026"


def _clock(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%H:%M:%S")


def render_html(
    data: ProfileData,
    results: Sequence[RuleEvaluation],
    *,
    job_name: str | None = None,
    metrics: Mapping[str, Any] | None = None,
    new_data: str = "",
) -> str:
    """The page; `new_data` is the run's "New data" section (`trainer/screening/report.py`), if any."""
    title = f"Profiling report: {job_name}" if job_name else "Profiling report"
    issues = [r for r in results if r.status == "IssuesFound"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class='sub'>Generated {_e(datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC'))} by the "
        "trainer's built-in profiler (SageMaker Debugger's rule definitions).</p>",
        _summary_cards(data, results, issues),
        new_data,
        "<h2>Rules</h2>",
        _rules_table(results),
        "<h2>Where step time goes</h2>",
        _rank_table(data.steps),
        _timelines(data.steps),
        _eval_passes(data.steps),
        "<h2>CPU utilization</h2>",
        _heatmaps(data.system, "CPUUtilization", "cores"),
        "<h2>GPU utilization</h2>",
        _heatmaps(data.system, "GPUUtilization", "GPUs")
        or "<p class='muted'>No GPU metrics on this run (a CPU host).</p>",
        _heatmaps(data.system, "GPUMemoryUtilization", "GPU memory"),
    ]
    if metrics:
        parts += ["<h2>Training</h2>", _curves(metrics), "<h2>Lineage</h2>", _lineage(metrics)]
    parts.append("</body></html>")
    return "\n".join(part for part in parts if part)


def _summary_cards(data: ProfileData, results: Sequence[RuleEvaluation], issues: Sequence[RuleEvaluation]) -> str:
    train = list(_by_rank(data.steps, "TRAIN").values())
    total = sum(float(ranked.duration.sum()) for ranked in train)
    wait = sum(float(ranked.data_wait.sum()) for ranked in train)
    comm = sum(float(ranked.communication.sum()) for ranked in train)
    evaluation = sum(len(ranked) for ranked in _by_rank(data.steps, "EVAL").values())
    hosts = sorted(data.system.nodes())
    ranks = sorted(data.steps.ranks())
    judged = [r for r in results if r.applicable]
    cards = [
        ("rules with issues", f"{len(issues)} of {len(judged)} that could judge"),
        ("rules not applicable on this host", str(len(results) - len(judged))),
        ("training steps (all ranks)", str(sum(len(ranked) for ranked in train))),
        ("validation steps (all ranks)", str(evaluation)),
        ("data wait", f"{100 * wait / total:.1f} %" if total else "-"),
        ("communication", f"{100 * comm / total:.1f} %" if total else "-"),
        ("hosts / ranks", f"{len(hosts)} / {len(ranks)}"),
    ]
    body = "".join(f"<div class='card'><b>{_e(v)}</b>{_e(k)}</div>" for k, v in cards)
    return f"<div class='cards'>{body}</div>"


def _rules_table(results: Sequence[RuleEvaluation]) -> str:
    order = {"IssuesFound": 0, "Error": 1, "NoIssuesFound": 2}
    rows = []
    for result in sorted(results, key=lambda r: (order.get(r.status, 3) + (0 if r.applicable else 2), r.name)):
        evidence = json.dumps(result.to_dict()["evidence"], indent=1)[:6000]
        parameters = ", ".join(f"{k}={v}" for k, v in result.parameters.items())
        advice = _e(result.recommendation or result.detail or "")
        if result.recommendation and result.detail:
            advice += f" <span class='muted'>({_e(result.detail)})</span>"
        badge = f"<span class='badge {_e(result.status)}'>{_e(result.status)}</span>"
        if not result.applicable:
            # Debugger's status is NoIssuesFound, but nothing was judged: grey, not a green pass.
            reason = result.not_applicable_reason or result.detail or "nothing to judge"
            advice = f"<span class='muted'>not applicable on this host: {_e(reason)}</span>"
            badge = (
                f"<span class='badge NotApplicable' title='status {_e(result.status)}, not applicable'>"
                "not applicable</span>"
            )
        rows.append(
            f"<tr><td><b>{_e(result.name)}</b></td>"
            f"<td>{badge}</td>"
            f"<td>{result.trigger_count}</td><td>{advice}"
            f"<details><summary>evidence and parameters</summary>"
            f"<p class='muted'>{_e(parameters)}</p><pre>{_e(evidence)}</pre></details></td></tr>"
        )
    return (
        "<table class='rules'><tr><th>rule</th><th>status</th><th>triggers</th>"
        f"<th>what it means, what to do</th></tr>{''.join(rows)}</table>"
    )


def _by_rank(steps: StepColumns, phase: str) -> dict[int, StepArrays]:
    """One phase's steps per rank, sorted by start (a step without a phase is a TRAIN step)."""
    return steps.groups(lambda s: int(s.get("rank", 0)), lambda s: s.get("phase", "TRAIN") == phase)


def _rank_table(steps: StepColumns) -> str:
    per_rank = _by_rank(steps, "TRAIN")
    if not per_rank:
        return "<p class='muted'>No training steps recorded.</p>"
    slowest = max(float(ranked.duration.sum()) / len(ranked) for ranked in per_rank.values())
    rows = []
    for rank, ranked in sorted(per_rank.items()):
        total = float(ranked.duration.sum()) or 1e-12
        mean = total / len(ranked)
        fractions = [float(part.sum()) / total for part in (ranked.data_wait, ranked.compute, ranked.communication)]
        bar = _stacked_bar(fractions, 220 * mean / slowest if slowest else 0)
        rows.append(
            f"<tr><td>rank {rank}</td><td>{_e(ranked.get(0, 'node', ''))}</td>"
            f"<td>{len(ranked)}</td><td>{mean * 1000:.1f} ms</td>"
            + "".join(f"<td>{100 * f:.1f} %</td>" for f in fractions)
            + f"<td>{bar}</td></tr>"
        )
    return (
        "<h3>Per-rank load balance (training steps)</h3><table class='ranks'><tr><th>rank</th>"
        "<th>host</th><th>steps</th><th>mean step</th><th>data wait</th><th>compute</th>"
        f"<th>communication</th><th></th></tr>{''.join(rows)}</table>"
    )


def _stacked_bar(fractions: Sequence[float], width: float) -> str:
    x, rects = 0.0, []
    for fraction, color in zip(fractions, (WAIT, COMPUTE, COMMUNICATION), strict=True):
        w = width * fraction
        rects.append(f"<rect x='{x:.1f}' y='0' width='{w:.1f}' height='12' fill='{color}'/>")
        x += w
    return f"<svg width='222' height='12' role='img'>{''.join(rects)}</svg>"


def _timelines(steps: StepColumns) -> str:
    per_rank = _by_rank(steps, "TRAIN")
    if not per_rank:
        return ""
    legend = (
        f"<p class='legend'><span style='background:{WAIT}'></span> data wait "
        f"<span style='background:{COMPUTE}'></span> compute "
        f"<span style='background:{COMMUNICATION}'></span> communication "
        "<small class='muted'>(each bar: the mean step of a run of consecutive steps)</small></p>"
    )
    charts = []
    for rank, ranked in sorted(per_rank.items()):
        count = len(ranked)
        size = max(1, math.ceil(count / MAX_BARS))
        firsts = np.arange(0, count, size)
        lengths = np.diff(np.append(firsts, count))
        parts = (ranked.data_wait, ranked.compute, ranked.communication)
        means = np.stack([np.add.reduceat(part, firsts) / lengths for part in parts], axis=1).tolist()
        top = max((sum(m) for m in means), default=0.0) or 1e-9
        width, height, left = 1000, 120, 50
        bar = (width - left) / len(means)
        rects = []
        for i, parts in enumerate(means):
            y = float(height)
            for value, color in zip(parts, (WAIT, COMPUTE, COMMUNICATION), strict=True):
                h = (height - 10) * value / top
                y -= h
                rects.append(
                    f"<rect x='{left + i * bar:.1f}' y='{y:.1f}' width='{max(bar - 0.5, 0.5):.1f}'"
                    f" height='{h:.1f}' fill='{color}'/>"
                )
        last = count - 1
        axis = (
            f"<text x='0' y='14'>{top * 1000:.0f} ms</text><text x='0' y='{height}'>0</text>"
            f"<text x='{left}' y='{height + 14}'>step {_e(ranked.get(0, 'step'))} (epoch "
            f"{_e(ranked.get(0, 'epoch'))})</text><text x='{width}' y='{height + 14}' "
            f"text-anchor='end'>step {_e(ranked.get(last, 'step'))} (epoch {_e(ranked.get(last, 'epoch'))})</text>"
        )
        charts.append(
            f"<h3>rank {rank} ({_e(ranked.get(0, 'node', ''))}): {count} steps</h3>"
            f"<svg viewBox='0 0 {width} {height + 18}' width='100%' role='img'>"
            f"{''.join(rects)}{axis}</svg>"
        )
    return "<h3>Step timelines</h3>" + legend + "".join(charts)


def _eval_passes(steps: StepColumns) -> str:
    """The validation batches (EVAL steps), apart from the training steps the figures above and
    the step rules (DataStall, LossNotDecreasing) are about: one row per validation pass."""
    title = "<h3>Validation passes (EVAL steps, not counted as training steps)</h3>"
    passes = steps.groups(lambda s: (s.get("epoch"), int(s.get("rank", 0))), lambda s: s.get("phase") == "EVAL")
    if not passes:
        return title + "<p class='muted'>No validation steps recorded.</p>"
    by_epoch: dict[Any, list[StepArrays]] = defaultdict(list)
    for (epoch, _), ranked in passes.items():
        by_epoch[epoch].append(ranked)
    rows = []
    batches_all, seconds_all = 0, 0.0
    for epoch in sorted(by_epoch, key=lambda e: (e is None, e if isinstance(e, int | float) else 0)):
        groups = by_epoch[epoch]
        batches = sum(len(ranked) for ranked in groups)
        total = sum(float(ranked.duration.sum()) for ranked in groups)
        wait = sum(float(ranked.data_wait.sum()) for ranked in groups)
        slowest = max(float(ranked.duration.sum()) for ranked in groups)  # the pass ends with its slowest rank
        batches_all, seconds_all = batches_all + batches, seconds_all + slowest
        mean = f"{1000 * total / batches:.1f} ms" if total > 0 else "-"
        waited = f"{100 * wait / total:.1f} %" if total > 0 else "-"
        rows.append(
            f"<tr><td>{_e(epoch)}</td><td>{len(groups)}</td><td>{batches}</td><td>{slowest:.2f} s</td>"
            f"<td>{mean}</td><td>{waited}</td></tr>"
        )
    rows.append(f"<tr><th>all</th><td></td><th>{batches_all}</th><th>{seconds_all:.2f} s</th><td></td><td></td></tr>")
    return (
        title + "<table class='ranks'><tr><th>epoch</th><th>ranks</th><th>batches (all ranks)</th>"
        "<th>pass time (slowest rank)</th><th>mean batch</th><th>data wait</th></tr>"
        f"{''.join(rows)}</table>"
    )


def _heatmaps(system: SystemColumns, dimension: str, what: str) -> str:
    grouped: dict[str, dict[str, tuple[Any, Any]]] = defaultdict(dict)
    for (node, name), points in system.series(dimension).items():
        grouped[node][name] = points
    if not grouped:
        return ""
    out = []
    for node, names in sorted(grouped.items()):
        stamps = np.sort(np.concatenate([t for t, _ in names.values()]))
        start, end = float(stamps[0]), float(stamps[-1])
        distinct = 1 + int(np.count_nonzero(stamps[1:] != stamps[:-1]))
        del stamps
        columns = max(1, min(MAX_COLUMNS, distinct))
        span = (end - start) / columns or 1.0
        rows = []
        for name in sorted(names, key=_natural):
            times, values = names[name]
            # Truncated as int() truncates; bincount adds each column's values in order, as += did.
            index = np.minimum(columns - 1, ((times - start) / span).astype(np.int64))
            sums = np.bincount(index, weights=values, minlength=columns).tolist()
            counts = np.bincount(index, minlength=columns).tolist()
            cells = "".join(
                f"<td style='background:{_color(s / c)}' title='{_e(name)} "
                f"{_clock(start + i * span)}: {s / c:.0f} %'></td>"
                if c
                else "<td></td>"
                for i, (s, c) in enumerate(zip(sums, counts, strict=True))
            )
            rows.append(f"<tr><th>{_e(name)}</th>{cells}</tr>")
        # Below the table, not in it: a cell spanning few 7 px columns would wrap every word.
        axis = (
            f"<p class='muted' style='font-size:11px;margin-top:2px'>{_clock(start)} to "
            f"{_clock(end)} UTC ({end - start:.0f} s; a column is {span:.1f} s)</p>"
        )
        out.append(
            f"<h3>{_e(node)}: {_e(what)} ({_e(dimension)})</h3><table class='heat'>{''.join(rows)}</table>{axis}"
        )
    legend = "".join(f"<span style='background:{_color(v)}'></span>" for v in range(0, 101, 10))
    return "".join(out) + f"<p class='legend muted'>0 % {legend} 100 %</p>"


def _natural(name: str) -> tuple[str, int]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return name.rstrip("0123456789"), int(digits) if digits else -1


def _curves(metrics: Mapping[str, Any]) -> str:
    epochs = list(metrics.get("epochs") or [])
    if not epochs:
        return "<p class='muted'>No evaluated epoch yet.</p>"
    charts = []
    for key, label, color in (("train_loss", "training loss", "#6a1b9a"), ("miou", "validation mIoU", "#00897b")):
        values = [
            (float(e.get("epoch", i)), float(e[key]))
            for i, e in enumerate(epochs)
            if isinstance(e.get(key), int | float) and math.isfinite(float(e[key]))
        ]
        if not values:
            continue
        charts.append(_line_chart(values, label, color))
    return "<div class='cards'>" + "".join(charts) + "</div>"


def _line_chart(values: Sequence[tuple[float, float]], label: str, color: str) -> str:
    width, height, pad = 460, 180, 36
    xs, ys = [x for x, _ in values], [y for _, y in values]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(0.0, *ys), max(ys) if max(ys) > 0 else 1.0
    points = " ".join(
        f"{pad + (width - 2 * pad) * (x - x0) / (x1 - x0):.1f},"
        f"{height - pad - (height - 2 * pad) * (y - y0) / ((y1 - y0) or 1):.1f}"
        for x, y in values
    )
    return (
        f"<div class='card'><b style='font-size:14px'>{_e(label)}</b>"
        f"<svg width='{width}' height='{height}' role='img'>"
        f"<polyline points='{points}' fill='none' stroke='{color}' stroke-width='2'/>"
        f"<text x='{pad}' y='{height - 8}'>epoch {x0:g}</text>"
        f"<text x='{width - pad}' y='{height - 8}' text-anchor='end'>epoch {x1:g}</text>"
        f"<text x='2' y='{pad - 10}'>{y1:.3g}</text><text x='2' y='{height - pad}'>{y0:.3g}</text>"
        f"<text x='{width - pad}' y='{pad - 10}' text-anchor='end'>last {ys[-1]:.4g}</text>"
        "</svg></div>"
    )


def _lineage(metrics: Mapping[str, Any]) -> str:
    keys = (
        "dataset_version",
        "code_sha256",
        "torch_version",
        "seed",
        "host",
        "train_images",
        "val_images",
        "init_from",
        "resumed_from",
        "loader",
        "miou",
        "stopped_by_rule",
    )
    rows = []
    for key in keys:
        value = metrics.get(key)
        if value is None:
            continue
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        rows.append(f"<tr><th>{_e(key)}</th><td>{_e(text)}</td></tr>")
    return f"<table class='kv'>{''.join(rows)}</table>" if rows else ""
