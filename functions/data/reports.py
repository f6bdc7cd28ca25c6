"""The batch report: what became of every file of a batch, as JSON for machines and Markdown
for the annotation team. Written to reports/batches/<batch>/, outside the notification prefix.

Its trust part is per pair content (docs/screening.md, "Earning trust from the start"): how many of the batch's
curated pairs are held, released, benchmark, trusted or new, the last decisions over them (a run's
screening, or a named person), and the pairs the team should relabel, worst first, each with its
picture beside the report (`fix/<n>.png`, copied there by the evaluation; blurred, or none, as the
stack's HeldPairPictures says, and the list says which).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel

from functions.common import prefixes
from functions.data.ledger import Ledger
from functions.data.models import BatchTrust, FileRecord, FileStatus, PairRecord, PairStatus, Trust, TrustDecision
from functions.data.storage import DataBucket
from functions.validation import Role

REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"
NEW = "new"  # a pair content without a verdict
DECISIONS_SHOWN = 5
# What the relabel list says of its pictures, by the stack's HeldPairPictures (show: nothing).
PICTURE_NOTES = {
    "blur": (
        "The pictures are blurred so that no face or number plate can be read (the stack's HeldPairPictures): "
        "the label and the model's prediction beside each are sharp; open the image itself from your batch."
    ),
    "omit": (
        "No pictures: the images show faces and number plates, and this stack keeps them out of its reports "
        "(HeldPairPictures omit). Open each image from your batch."
    ),
}


class PairTrustCounts(BaseModel):
    """A batch's curated pairs by the trust of their content (`new`: no verdict for it)."""

    held: int = 0
    released: int = 0
    benchmark: int = 0
    trusted: int = 0
    new: int = 0

    @property
    def total(self) -> int:
        return self.held + self.released + self.benchmark + self.trusted + self.new

    def summary(self) -> str:
        """`new`, `held`, or `3 held, 40 trusted`: one kind alone by its name, a mix with counts."""
        counted = [(name, count) for name, count in self.model_dump().items() if count]
        if not counted:
            return NEW  # nothing curated yet: nothing has been judged
        if len(counted) == 1:
            return counted[0][0]
        return ", ".join(f"{count} {name}" for name, count in counted)


def curated_contents(pairs: Iterable[PairRecord]) -> dict[str, str]:
    """Stem -> digest of the batch's curated pairs as they are now: what a verdict can apply to.
    A digest in the trust item and not here is history (a label replaced since, a pair erased)."""
    return {
        pair.stem: digest for pair in pairs if pair.status is PairStatus.VALID and (digest := pair.digest) is not None
    }


def count_trust(trust: BatchTrust | None, digests: Iterable[str]) -> PairTrustCounts:
    """How many of `digests` (the batch's current pairs) are held, released, ... or new."""
    counted = Counter((trust.of(digest) if trust else None) or NEW for digest in digests)
    return PairTrustCounts(**{str(name): count for name, count in counted.items()})


def trust_part(trust: BatchTrust | None, pairs: Iterable[PairRecord]) -> dict[str, Any]:
    """The report's `trust`: counts of the current pairs, the last decisions (newest first), the
    relabel list (worst first)."""
    counts = count_trust(trust, curated_contents(pairs).values())
    decisions = list(reversed(trust.decisions[-DECISIONS_SHOWN:])) if trust else []
    return {
        "summary": counts.summary(),
        "pairs": counts.model_dump(),
        "decisions": [decision.model_dump(mode="json") for decision in decisions],
        "to_fix": [pair.model_dump(mode="json") for pair in trust.to_fix] if trust else [],
        "pictures": trust.pictures if trust else "show",
    }


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
    return {
        "batch": batch,
        "status": found[0].status.value if found else "unknown",
        # How far its pairs' labels are trusted: held pairs are in no dataset version (`retrain data held`).
        "trust": trust_part(ledger.trust(batch), pairs),
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
    lines += _trust_markdown(report["batch"], report.get("trust", {}))
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


def _trust_markdown(batch: str, trust: dict[str, Any]) -> list[str]:
    """The team's view of its labels' trust: what is held and why, what to relabel, what to do."""
    counts = PairTrustCounts.model_validate(trust.get("pairs", {}))
    decisions = [TrustDecision.model_validate(d) for d in trust.get("decisions", [])]
    to_fix = trust.get("to_fix", [])
    if not counts.total and not decisions and not to_fix:
        return []
    lines = ["", f"Labels: {counts.summary()} (of {counts.total} curated pairs; trust follows each pair's content)"]
    if counts.held:
        held = next((d for d in decisions if d.verdict in {Trust.HELD, "left out"}), None)
        by = f" Held by {held.by}, {held.at:%Y-%m-%d %H:%M} UTC." if held else ""
        lines += [
            "",
            "## Held: left out of training",
            "",
            f"{counts.held} of its pairs are in no dataset version: their labels were found wrong.{by}",
            "Upload corrected labels (a new label is a new pair, screened again), ask for their release if they "
            f"are right (`retrain data release {batch} --reason ...`), or erase the batch "
            f"(`retrain data purge {batch}/`).",
        ]
        if held:
            lines += ["", *(f"- {reason}" for reason in held.reasons)]
    if to_fix:
        lines += ["", "## Pairs to fix, worst first", ""]
        for pair in to_fix:
            picture = f" ![{PurePosixPath(pair['image']).stem}]({pair['picture']})" if pair.get("picture") else ""
            lines.append(f"- `{pair['image']}`: {pair['why']} (label quality {pair['quality']:.2f}){picture}")
        if trust.get("pictures") in PICTURE_NOTES:
            lines += ["", PICTURE_NOTES[trust["pictures"]]]
        lines += [
            "",
            "What to do: upload corrected labels under the same batch "
            f"(`incoming/{batch}/labels/<stem>.png`). A new label is a new pair: the next run screens it "
            "again, and trains on it unless it is found wrong again. If the labels are right after all, ask an "
            f"operator for `retrain data release {batch} --reason ...`.",
        ]
    if decisions:
        lines += ["", "## Decisions on its labels, newest first", ""]
        for decision in decisions:
            why = "; ".join(decision.reasons)
            lines.append(
                f"- {decision.at:%Y-%m-%d %H:%M} UTC, {decision.verdict} by {decision.by} "
                f"({decision.pairs} pairs)" + (f": {why}" if why else "")
            )
    return [*lines, ""]


def write_report(batch: str, ledger: Ledger, bucket: DataBucket) -> dict[str, Any]:
    report = build_report(batch, ledger)
    bucket.put_json(prefixes.report_key(batch, REPORT_JSON), report)
    bucket.put_text(prefixes.report_key(batch, REPORT_MARKDOWN), render_markdown(report), "text/markdown")
    return report
