"""`reports/index.html`: every run on one page, rewritten by each evaluation.

One self-contained page (no script, no network) that answers what the teams ask across runs:
which dataset version each run trained on, what the gate said, mIoU and each class's IoU over
time, and which batches each run used, held or made trusted. Built from the runs' own
`summary.json` files, so it can be rebuilt at any time from the bucket.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from functions.common import prefixes
from functions.common.summary import RunSummary

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

HISTORY_KEY = f"{prefixes.REPORTS}index.html"
STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left}th{background:#f4f4f4}"
    ".accepted{color:#2e7d32;font-weight:600}.rejected{color:#c62828;font-weight:600}.muted{color:#777}"
)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def summaries(s3: S3Client, bucket: str) -> list[RunSummary]:
    """Every run's summary.json, evaluated (reports/runs/) or ended before (reports/failures/),
    oldest first; one that does not parse is skipped, and of a run with both the failure counts
    (`prefixes.summary_keys`)."""
    keys: list[str] = []
    for prefix in (prefixes.RUN_REPORTS, prefixes.FAILED_RUNS):
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            page = s3.list_objects_v2(**request)
            keys += [item["Key"] for item in page.get("Contents", []) if item["Key"].endswith("/summary.json")]
            if not page.get("IsTruncated"):
                break
            request["ContinuationToken"] = page["NextContinuationToken"]
    found: dict[str, RunSummary] = {}
    for key in keys:  # evaluations first: a run's failure, read later, replaces its evaluation
        try:
            summary = RunSummary.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ValidationError:
            continue
        found[summary.run] = summary
    return sorted(found.values(), key=lambda s: s.finished_at)


def render(runs: Sequence[RunSummary]) -> str:
    classes = sorted({name for run in runs for name in run.per_class_iou})
    rows = []
    for run in reversed(runs):
        verdict = f"<span class='{_e(run.outcome)}'>{_e(run.outcome)}</span>"
        if run.gate is not None and run.gate.accepted_meanwhile is not None:
            instead = run.gate.accepted_meanwhile or "none (removed)"
            verdict += f"<br><span class='muted'>gate passed; accepted meanwhile: {_e(instead)}</span>"
        if run.gate is not None and run.gate.compared_on:
            verdict += f"<br><span class='muted'>{_e(run.gate.compared_on)}</span>"
        shown = run.gate.miou if run.gate is not None and run.gate.miou is not None else run.miou
        miou = "-" if shown is None else f"{shown:.3f}"
        if run.gate is not None and run.gate.miou_change is not None:
            miou += f" ({run.gate.miou_change:+.3f})"
        per_class = "".join(
            f"<td>{'-' if run.per_class_iou.get(name) is None else f'{run.per_class_iou[name]:.2f}'}</td>"
            for name in classes
        )
        used = ", ".join(name for name, scores in run.batch_scores.items() if not scores.held)
        held = ", ".join(run.held) or "-"
        report = f"<a href='runs/{_e(run.run)}/report.html'>report</a>"
        rows.append(
            f"<tr><td>{_e(run.finished_at.strftime('%Y-%m-%d %H:%M'))}</td><td>{_e(run.run)}<br>{report}</td>"
            f"<td>{_e(run.dataset_version)}</td><td>{verdict}</td><td>{miou}</td>{per_class}"
            f"<td>{_e(used or '-')}</td><td>{_e(held)}</td><td>{_e(', '.join(run.newly_trusted) or '-')}</td></tr>"
        )
    head = "".join(f"<th>{_e(name)}</th>" for name in classes)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Retraining runs</title>"
        f"<style>{STYLE}</style></head><body><h1>Retraining runs</h1>"
        f"<p class='muted'>{len(runs)} runs, newest first. mIoU and the change are the gate's (on trusted "
        "pairs where the run had them); the per-class IoU is on each run's validation split.</p>"
        "<table><tr><th>finished (UTC)</th><th>run</th><th>dataset version</th><th>gate</th><th>mIoU</th>"
        f"{head}<th>batches scored</th><th>held</th><th>now trusted</th></tr>{''.join(rows)}</table>"
        "</body></html>"
    )


def rewrite(s3: S3Client, bucket: str, newest: RunSummary | None = None) -> str:
    """Rewrite the page from the bucket's summaries (`newest` counted even if S3 lists it late)."""
    runs = [run for run in summaries(s3, bucket) if newest is None or run.run != newest.run]
    page = render([*runs, newest] if newest is not None else runs)
    s3.put_object(Bucket=bucket, Key=HISTORY_KEY, Body=page.encode(), ContentType="text/html; charset=utf-8")
    return f"s3://{bucket}/{HISTORY_KEY}"
