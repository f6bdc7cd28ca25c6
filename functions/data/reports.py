"""The batch report: what became of every file of a batch, as JSON for machines and Markdown
for the annotation team. Written to reports/batches/<batch>/, outside the notification prefix."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from functions.common import prefixes
from functions.data.ledger import Ledger
from functions.data.models import FileRecord, FileStatus, PairStatus
from functions.data.storage import DataBucket
from functions.validation import Role

REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"


def build_report(batch: str, ledger: Ledger) -> dict[str, Any]:
    found = ledger.batch(batch)
    files = _current(ledger.files(batch))
    pairs = ledger.pairs(batch)
    rejected: dict[str, list[dict[str, str]]] = defaultdict(list)
    for record in files:
        # A refused file is rejected too; its message says it was left in incoming/ and why.
        if record.status in {FileStatus.QUARANTINED, FileStatus.REFUSED}:
            for reason in record.reasons:
                rejected[reason.code.value].append({"key": record.key, "message": reason.message})
    class_pixels: Counter[str] = Counter()
    for pair in pairs:
        if pair.status is PairStatus.VALID:
            class_pixels.update(pair.class_pixels)
    trust = ledger.trust(batch)
    return {
        "batch": batch,
        "status": found[0].status.value if found else "unknown",
        # How far its labels are trusted: held batches are in no dataset version (`retrain data held`).
        "trust": trust.model_dump(mode="json", exclude={"batch"}) if trust else {"trust": "new"},
        "closed_by": found[0].close_reason if found else None,
        "files": dict(Counter(record.status.value for record in files)),
        "pairs": dict(Counter(pair.status.value for pair in pairs)),
        "accepted": sorted(p.stem for p in pairs if p.status is PairStatus.VALID),
        "rejected": {code: sorted(items, key=lambda i: i["key"]) for code, items in rejected.items()},
        "duplicates": sorted(
            (
                {"key": r.key, "original": r.duplicate_of or ""}
                for r in files
                if r.status is FileStatus.DUPLICATE and r.role is Role.IMAGE
            ),
            key=lambda d: d["key"],
        ),
        "pending": sorted(p.stem for p in pairs if p.status is PairStatus.PENDING),
        "class_pixels": dict(class_pixels.most_common()),
    }


def _current(files: list[FileRecord]) -> list[FileRecord]:
    """One record per key: a superseded version stays in the ledger, not in the headline."""
    latest: dict[str, FileRecord] = {}
    for record in sorted(files, key=lambda r: r.recorded_at):
        if record.status is not FileStatus.SUPERSEDED or record.key not in latest:
            latest[record.key] = record
    return list(latest.values())


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Batch {report['batch']}",
        "",
        f"Status: {report['status']}" + (f" (closed by {report['closed_by']})" if report["closed_by"] else ""),
        "",
        "| outcome | files |",
        "|---|---|",
        *(f"| {status} | {count} |" for status, count in sorted(report["files"].items())),
        "",
        f"Accepted pairs: {len(report['accepted'])}",
    ]
    trust = report.get("trust", {})
    if trust.get("trust") == "held":
        lines += [
            "",
            "## Held: left out of training",
            "",
            f"The accepted model confidently contradicts these labels (run {trust.get('run')}). The batch is in",
            "no dataset version until an operator releases it (`retrain data release "
            f"{report['batch']}`) or erases it (`retrain data purge {report['batch']}/`).",
            "",
            *(f"- {reason}" for reason in trust.get("reasons", [])),
        ]
    if report["rejected"]:
        lines += ["", "## Rejected, by reason", ""]
        for code, items in sorted(report["rejected"].items()):
            lines.append(f"### `{code}` ({len(items)})")
            lines += [f"- `{item['key']}`: {item['message']}" for item in items]
            lines.append("")
    if report["duplicates"]:
        lines += ["## Duplicates", ""]
        lines += [f"- `{d['key']}` repeats `{d['original']}`" for d in report["duplicates"]]
        lines.append("")
    if report["pending"]:
        lines += ["## Waiting for their partner", ""]
        lines += [f"- `{stem}`" for stem in report["pending"]]
        lines.append("")
    total = sum(report["class_pixels"].values())
    if total:
        lines += [
            "## Class pixels (accepted pairs)",
            "",
            "| class | pixels | share |",
            "|---|---|---|",
        ]
        lines += [
            f"| {name} | {count} | {100 * count / total:.1f} % |" for name, count in report["class_pixels"].items()
        ]
    return "\n".join(lines) + "\n"


def write_report(batch: str, ledger: Ledger, bucket: DataBucket) -> dict[str, Any]:
    report = build_report(batch, ledger)
    bucket.put_json(prefixes.report_key(batch, REPORT_JSON), report)
    bucket.put_text(prefixes.report_key(batch, REPORT_MARKDOWN), render_markdown(report), "text/markdown")
    return report
