"""`reports/index.html`: every run on one page, rewritten by each evaluation.

One self-contained page (no script, no network) that answers what the teams ask across runs:
which dataset version each run trained on, what the gate said, mIoU and each class's IoU over
time, and which batches each run used, held or made trusted. Built from the runs' own
`summary.json` files, so it can be rebuilt at any time from the bucket.

Numbers that agree: the mIoU column is the gate's, with its change against the accepted model
scored on the same pairs, and names those pairs (`GateVerdict.compared_on`); the whole validation
split's mIoU has a column of its own and no change (the split grows with every drop).

Slow poisoning: "Likely label errors by team" lists, per annotation team, the share of each of its
drops' judged pairs the accepted model contradicted (`ScreenedBatchSummary.likely_error_share`),
oldest to newest. Each drop counts once, at the first run whose screening judged any of its pairs
(a drop screened again later, not judged before or released since, keeps that first share). A
team *drifts upward* when its newest drops rise: the run of strictly rising shares that ends at
its newest drop covers at least `DRIFT_DROPS` drops, and the newest share is at least
`DRIFT_FACTOR` times the first of that run and at least `DRIFT_MIN_SHARE`. Each drop alone can
stay under the screen's thresholds while the labels get steadily worse; the page names such a
team at the top, in a warning line.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from functions.common import prefixes
from functions.common.contracts import team_of
from functions.common.summary import RunSummary

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

HISTORY_KEY = f"{prefixes.REPORTS}index.html"
STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left}th{background:#f4f4f4}"
    ".accepted{color:#2e7d32;font-weight:600}.rejected{color:#c62828;font-weight:600}.muted{color:#777}"
    ".warning{background:#fdecea;border-left:4px solid #c62828;padding:8px 12px}"
)
DRIFT_DROPS = 3  # screened drops in a row, each with a higher share of likely label errors
DRIFT_FACTOR = 2.0  # the newest share at least this many times the first of them
DRIFT_MIN_SHARE = 0.05  # and at least this: doubling from 0.5 % to 1 % is noise, not poisoning


@dataclass(frozen=True)
class Drop:
    """One team's drop as the first screening that judged it saw it."""

    batch: str
    share: float  # of its judged pairs, those the accepted model contradicted
    run: str
    held: bool


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


def team_drops(runs: Sequence[RunSummary]) -> dict[str, list[Drop]]:
    """Each team's judged drops, oldest to newest (`runs` oldest first), each drop once."""
    teams: dict[str, list[Drop]] = {}
    seen: set[str] = set()
    for run in runs:
        screened = run.screening.batches if run.screening is not None else {}
        for batch, found in sorted(screened.items()):
            share = found.likely_error_share
            if share is None or batch in seen:
                continue
            seen.add(batch)
            teams.setdefault(found.team or team_of(batch), []).append(Drop(batch, share, run.run, found.held))
    return teams


def rising(drops: Sequence[Drop]) -> list[Drop]:
    """The drops of a team's upward drift (the newest last), or [] when its shares do not drift."""
    start = len(drops) - 1
    while start > 0 and drops[start - 1].share < drops[start].share:
        start -= 1
    streak = list(drops[start:])
    if len(streak) < DRIFT_DROPS:
        return []
    first, newest = streak[0].share, streak[-1].share
    return streak if newest >= DRIFT_FACTOR * first and newest >= DRIFT_MIN_SHARE else []


def _percent(share: float) -> str:
    return "<1 %" if 0 < share < 0.01 else f"{share * 100:.0f} %"


def _label_errors(teams: dict[str, list[Drop]]) -> tuple[str, str]:
    """The warning line for the top of the page ("" when no team drifts) and the section."""
    drifting = {team: streak for team, drops in sorted(teams.items()) if (streak := rising(drops))}
    warning = ""
    if drifting:
        named = "; ".join(
            f"{_e(team)} ({' → '.join(_percent(d.share) for d in streak)} over its {len(streak)} newest drops)"
            for team, streak in drifting.items()
        )
        warning = (
            f"<p class='warning' id='drift'><strong>Likely label errors drifting upward</strong>: {named}. "
            "Each drop may pass the screen on its own: read their relabel lists in reports/batches/ before the "
            "model learns what they teach (<a href='#label-errors'>by team</a>).</p>"
        )
    rows = []
    for team, drops in sorted(teams.items()):
        shown = " → ".join(
            f"{_e(d.batch)}: {_percent(d.share)}{' (held)' if d.held else ''} <span class='muted'>{_e(d.run)}</span>"
            for d in drops
        )
        flag = "<span class='rejected'>drifting upward</span>" if team in drifting else "-"
        rows.append(f"<tr><td>{_e(team)}</td><td>{shown}</td><td>{flag}</td></tr>")
    section = (
        "<h2 id='label-errors'>Likely label errors by team</h2>"
        "<p class='muted'>Of each drop's pairs the accepted model judged, the share it contradicted, oldest to "
        "newest, with the run that screened it. A team drifts upward when its shares rose drop after drop over "
        f"at least {DRIFT_DROPS} drops, the newest at least {DRIFT_FACTOR:g} times the first of them and at "
        f"least {_percent(DRIFT_MIN_SHARE)}.</p>"
    )
    if rows:
        section += (
            "<table><tr><th>team</th><th>drops, oldest to newest</th><th>drift</th></tr>" + "".join(rows) + "</table>"
        )
    else:
        section += "<p>No drop has been judged yet.</p>"
    return warning, section


def render(runs: Sequence[RunSummary]) -> str:
    classes = sorted({name for run in runs for name in run.per_class_iou})
    rows = []
    for run in reversed(runs):
        verdict = f"<span class='{_e(run.outcome)}'>{_e(run.outcome)}</span>"
        if run.gate is not None and run.gate.accepted_meanwhile is not None:
            instead = run.gate.accepted_meanwhile or "none (removed)"
            verdict += f"<br><span class='muted'>gate passed; accepted meanwhile: {_e(instead)}</span>"
        shown = run.gate.miou if run.gate is not None and run.gate.miou is not None else run.miou
        miou = "-" if shown is None else f"{shown:.3f}"
        if run.gate is not None and run.gate.miou_change is not None:
            miou += f" ({run.gate.miou_change:+.3f})"
        if run.gate is not None and run.gate.compared_on:
            miou += f"<br><span class='muted'>{_e(run.gate.compared_on)}</span>"
        elif shown is not None:
            miou += "<br><span class='muted'>this run's validation split</span>"
        split = "-" if run.miou is None else f"{run.miou:.3f}"
        per_class = "".join(
            f"<td>{'-' if run.per_class_iou.get(name) is None else f'{run.per_class_iou[name]:.2f}'}</td>"
            for name in classes
        )
        used = ", ".join(name for name, scores in run.batch_scores.items() if not scores.held)
        held = ", ".join(run.held) or "-"
        report = f"<a href='runs/{_e(run.run)}/report.html'>report</a>"
        rows.append(
            f"<tr><td>{_e(run.finished_at.strftime('%Y-%m-%d %H:%M'))}</td><td>{_e(run.run)}<br>{report}</td>"
            f"<td>{_e(run.dataset_version)}</td><td>{verdict}</td><td>{miou}</td><td>{split}</td>{per_class}"
            f"<td>{_e(used or '-')}</td><td>{_e(held)}</td><td>{_e(', '.join(run.newly_trusted) or '-')}</td></tr>"
        )
    head = "".join(f"<th>{_e(name)}</th>" for name in classes)
    warning, label_errors = _label_errors(team_drops(runs))
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Retraining runs</title>"
        f"<style>{STYLE}</style></head><body><h1>Retraining runs</h1>{warning}"
        f"<p class='muted'>{len(runs)} runs, newest first. mIoU (gate's pairs) and its change are the gate's: the "
        "candidate and the accepted model scored on the same pairs, named under it (trusted pairs where the run "
        "had them). mIoU (whole validation split) and the per-class IoU are on each run's whole validation "
        "split, which grows with every drop: no change is shown for them.</p>"
        "<table><tr><th>finished (UTC)</th><th>run</th><th>dataset version</th><th>gate</th>"
        "<th>mIoU (gate's pairs)</th><th>mIoU (whole validation split)</th>"
        f"{head}<th>batches scored</th><th>held</th><th>now trusted</th></tr>{''.join(rows)}</table>"
        f"{label_errors}</body></html>"
    )


def rewrite(s3: S3Client, bucket: str, newest: RunSummary | None = None) -> str:
    """Rewrite the page from the bucket's summaries (`newest` counted even if S3 lists it late)."""
    runs = [run for run in summaries(s3, bucket) if newest is None or run.run != newest.run]
    page = render([*runs, newest] if newest is not None else runs)
    s3.put_object(Bucket=bucket, Key=HISTORY_KEY, Body=page.encode(), ContentType="text/html; charset=utf-8")
    return f"s3://{bucket}/{HISTORY_KEY}"
