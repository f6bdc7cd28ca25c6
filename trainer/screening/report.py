"""The report's "New data" section: what screening found, and what each drop did to the model.

For people who would rather look than read: each batch's verdict and why, then for the worst pairs
of each batch with something to fix the image, its label, the model's prediction and the
disagreement side by side (the PNGs `pictures.py` left under `screening/`, embedded, so the page
stays one file without a script; blurred, or only named, as the stack's HeldPairPictures says)
with what to do, then each batch's validation IoU under the candidate against the accepted
model, and the trusted set's per-class table.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ANCHOR = "new-data"
# A class counts as moved on a batch when its IoU changed by at least this much.
MOVED = 0.01


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _iou(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def section(output_dir: Path, metrics: Mapping[str, Any] | None) -> str:
    """The section's HTML, or "" when the run has neither screening nor a per-batch evaluation."""
    metrics = metrics or {}
    screening_file = output_dir / "screening.json"
    screening = json.loads(screening_file.read_text(encoding="utf-8")) if screening_file.exists() else None
    evaluation = metrics.get("evaluation") or {}
    summary = metrics.get("screening") or {}
    if screening is None and not evaluation:
        return ""
    parts = [f"<h2 id='{ANCHOR}'>New data</h2>"]
    if screening is None:
        parts.append(
            f"<p class='muted'>Not screened: {_e(summary.get('why', 'no accepted model to screen with'))}.</p>"
        )
    else:
        parts += _screening(output_dir, screening)
    if evaluation:
        parts += _impact(evaluation)
    return "\n".join(parts)


# What the pictures are, by the stack's HeldPairPictures (screening.json's `pictures`; older runs: show).
LEGENDS = {
    "show": "image | label | the accepted model's prediction | disagreement (red)",
    "blur": (
        "image | label | the accepted model's prediction | disagreement (red); the image is blurred so that no "
        "face or number plate can be read (HeldPairPictures blur): open the image itself from the batch"
    ),
    "omit": (
        "Not pictured: the images show faces and number plates, and this stack leaves them out of reports "
        "(HeldPairPictures omit). Its worst pairs, to open from the batch:"
    ),
}


def _screening(output_dir: Path, screening: Mapping[str, Any]) -> list[str]:
    mode = screening.get("pictures", "show")
    calibration = screening.get("calibration", {})
    rule = screening.get("rule", {})
    parts = [
        f"<p>Every new pair judged by the accepted model <code>{_e(screening['model'])}</code>, calibrated on "
        f"{_e(calibration.get('text', ''))} ({calibration.get('pairs', 0)} pairs; {_e(calibration.get('kind', ''))}). "
        f"A pair is contradicted when {_pct(calibration.get('pair_bar'))} of its pixels contradict the model beyond "
        f"its usual confusions; a batch is held when {_pct(rule.get('batch_margin'))} of its judged pairs are, or "
        "when it labels a class otherwise throughout.</p>",
    ]
    if screening.get("corroborated_by"):
        parts.append(
            "<p>The model learned from labels nobody had checked; batches of other teams agreed with it ("
            f"{_e(', '.join(screening['corroborated_by']))}), so its verdicts stand.</p>"
        )
    parts += [
        "<table><tr><th>batch</th><th>team</th><th>pairs</th><th>judged</th><th>contradicted</th>"
        "<th>verdict</th><th>why</th></tr>",
    ]
    for name, batch in screening["batches"].items():
        verdict = batch["verdict"]
        shown = f"<span class='IssuesFound'>{_e(verdict)}</span>" if verdict != "ok" else "ok"
        reasons = "<br>".join(_e(reason) for reason in batch["reasons"])
        parts.append(
            f"<tr><td><a href='#batch-{_e(name)}'>{_e(name)}</a></td><td>{_e(batch.get('team', ''))}</td>"
            f"<td>{batch.get('pair_count', 0)}</td><td>{batch.get('judged', 0)}</td>"
            f"<td>{batch.get('contradicted', 0)}</td><td>{shown}</td><td>{reasons}</td></tr>"
        )
    parts.append("</table>")
    for name, batch in screening["batches"].items():
        pictured = [pair for pair in batch["pairs"] if "picture" in pair]
        if not pictured:
            continue
        parts.append(f"<h3 id='batch-{_e(name)}'>{_e(name)}: {_e(batch['verdict'])}, its worst pairs</h3>")
        if batch["held"]:
            parts.append(
                "<p>Left out of this run and of every later dataset version until fixed (a corrected label is a "
                f"new pair, screened again) or let in: <code>retrain data release {_e(name)} --reason ...</code>; "
                f"to erase it: <code>retrain data purge {_e(name)}/</code>.</p>"
            )
        elif batch["verdict"] == "disputed":
            parts.append(
                "<p>Trained on, not trusted. Decide which labels are right: name a benchmark of labels checked by "
                "hand (<code>retrain data benchmark BATCH --reason ... --checked-by-hand</code>) or hold the wrong "
                f"side (<code>retrain data hold {_e(name)} --reason ...</code>).</p>"
            )
        else:
            parts.append(
                "<p>The pairs to fix are on the team's relabel list (<code>reports/batches/"
                f"{_e(name)}/report.md</code>); the rest of the batch is trained on.</p>"
            )
        parts.append(f"<p class='muted'>{_e(LEGENDS.get(mode, LEGENDS['show']))}</p>")
        named = []
        for pair in pictured:
            caption = f"{pair['image']}: {pair['verdict']}; {pair.get('confusion') or 'contradicted'}"
            caption += f" (label quality {pair['quality']:.3f})"
            if pair["picture"] is None:
                named.append(f"<li>{_e(caption)}</li>")
                continue
            picture = output_dir / pair["picture"]
            if not picture.is_file():
                continue
            data = base64.b64encode(picture.read_bytes()).decode("ascii")
            parts.append(
                f"<figure><img alt='{_e(pair['image'])}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{_e(caption)}</figcaption></figure>"
            )
        if named:
            parts.append(f"<ul>{''.join(named)}</ul>")
    return parts


def _impact(evaluation: Mapping[str, Any]) -> list[str]:
    parts = [
        "<h3>Each drop's impact</h3>",
        "<table><tr><th>batch</th><th>trust</th><th>validation pairs</th><th>candidate mIoU</th>"
        "<th>accepted mIoU</th><th>classes that moved</th></tr>",
    ]
    for name, batch in evaluation.get("batches", {}).items():
        candidate, accepted = batch.get("candidate"), batch.get("accepted")
        if batch.get("held"):
            parts.append(f"<tr><td>{_e(name)}</td><td>{_e(batch['trust'])}</td><td colspan='4'>held</td></tr>")
            continue
        parts.append(
            f"<tr><td>{_e(name)}</td><td>{_e(batch['trust'])}</td><td>{batch['val_pairs']}</td>"
            f"<td>{_iou(candidate and candidate['miou'])}</td><td>{_iou(accepted and accepted['miou'])}</td>"
            f"<td>{_e(moved(candidate, accepted))}</td></tr>"
        )
    parts.append("</table>")
    trusted = evaluation.get("trusted", {})
    if trusted.get("candidate"):
        candidate, accepted = trusted["candidate"], trusted.get("accepted")
        parts += [
            f"<h3>The trusted set: {trusted['pairs']} pairs of {len(trusted['batches'])} batches</h3>",
            "<table><tr><th>class</th><th>candidate IoU</th><th>accepted IoU</th><th>change</th></tr>",
            _class_row("<b>mIoU</b>", candidate["miou"], accepted and accepted["miou"]),
        ]
        for name, value in candidate["per_class_iou"].items():
            before = (accepted or {}).get("per_class_iou", {}).get(name)
            if value is None and before is None:
                continue
            parts.append(_class_row(_e(name), value, before))
        parts.append("</table>")
    return parts


def _class_row(name: str, new: float | None, old: float | None) -> str:
    return f"<tr><td>{name}</td><td>{_iou(new)}</td><td>{_iou(old)}</td><td>{_change(new, old)}</td></tr>"


def _change(new: float | None, old: float | None) -> str:
    return "-" if new is None or old is None else f"{new - old:+.3f}"


def moved(candidate: Mapping[str, Any] | None, accepted: Mapping[str, Any] | None) -> str:
    """'road +0.052, sky -0.031': the classes whose IoU moved on a batch, largest first."""
    if not candidate or not accepted:
        return "-"
    changes = [
        (name, value - before)
        for name, value in candidate["per_class_iou"].items()
        if value is not None and (before := accepted["per_class_iou"].get(name)) is not None
    ]
    changes = sorted((c for c in changes if abs(c[1]) >= MOVED), key=lambda c: -abs(c[1]))
    return ", ".join(f"{name} {delta:+.3f}" for name, delta in changes[:5]) or "none by 0.01 or more"
