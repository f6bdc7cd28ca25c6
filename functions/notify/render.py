"""One renderer, two channels: a run summary as an e-mail (SNS) and as a Slack Block Kit message.

Both say the same things, in the same order: the outcome; the data (dataset version, pairs, new
pairs since the last run); duration, instances and an estimated cost; mIoU with its change and
the classes that got worse; what screening decided about the new data (`new_data.py`); each
profiler rule that found issues, with what to do (the rest in one line); for a failure, where, the
error and the first lines of the cause; then the links. Slack's limits (50 blocks, 3,000
characters a section, 10 fields, 75 a button label) hold whatever the run produced: long texts
are cut with an ellipsis, surplus rules summarised.

Numbers that agree: every mIoU says which pairs it was scored on, and a change is always the
gate's, against the accepted model scored on the same pairs (`GateVerdict.compared_on`; the
subject shortens it to "40 trusted pairs"). The run's whole validation split grows with new data
and the run summary holds no accepted model's score on it, so its mIoU is shown, named as such,
without a change.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from functions.common import rules
from functions.common.prices import estimated_cost
from functions.common.summary import GateVerdict, RunSummary
from functions.notify.links import RunLinks
from functions.notify.new_data import Entry, entries

SUBJECT_LIMIT = 100  # SNS refuses longer subjects
CAUSE_LINES = 8
MAX_BLOCKS = 50
SECTION_LIMIT = 3000
FIELD_LIMIT = 2000
HEADER_LIMIT = 150
BUTTON_LIMIT = 75
MAX_RULE_SECTIONS = 10
MAX_DATA_SECTIONS = 6  # Slack sections the new data may take (each packs whole entries)
# How gate.py's `compared_on` names a trusted set ("both scored on 40 trusted validation pairs of
# 3 batches"): read only from summaries written before the gate recorded `trusted_pairs`.
TRUSTED_PAIRS = re.compile(r"(\d+) trusted validation pairs")

HEADLINES = {
    "accepted": "Retraining accepted",
    "rejected": "Retraining rejected by the quality gate",
    "failed": "Retraining failed",
    "stopped": "Retraining stopped",
    "running": "Retraining started",
}
# A rejected run whose gate passed: another run's model was accepted while it trained.
SUPERSEDED_HEADLINE = "Retraining passed the gate, another run won"
_ICONS = {
    "accepted": ":white_check_mark:",
    "rejected": ":warning:",
    "failed": ":x:",
    "stopped": ":black_square_for_stop:",
    "running": ":arrow_forward:",
}


class Rendered(BaseModel):
    subject: str
    text: str  # the e-mail body
    slack: dict[str, Any]  # {"text": ..., "blocks": [...]}


def render(summary: RunSummary, links: RunLinks) -> Rendered:
    facts = _Facts(summary, links, summary.outcome)
    return Rendered(subject=facts.subject(), text=facts.email(), slack=facts.slack())


class _Facts:
    def __init__(self, summary: RunSummary, links: RunLinks, outcome: str) -> None:
        self.s = summary
        self.links = links
        self.outcome = outcome

    # ------------------------------------------------------------- the facts --
    def headline(self) -> str:
        if self.outcome == "rejected" and self.superseded():
            return SUPERSEDED_HEADLINE
        return HEADLINES[self.outcome]

    def superseded(self) -> bool:
        """The gate passed the model, but another run's was accepted first."""
        return self.s.gate is not None and self.s.gate.accepted_meanwhile is not None

    def gate_word(self) -> str:
        if self.s.gate is not None and self.s.gate.accepted:
            return "accepted"
        return "passed, not accepted" if self.superseded() else "rejected"

    def subject(self) -> str:
        s = self.s
        text = self.headline()
        fell = s.gate is not None and (s.gate.miou_change or 0.0) < -s.gate.miou_tolerance
        by_the_gate = self.outcome == "rejected" and not self.superseded()
        if by_the_gate and s.disputed:
            # The gate refused a run trained on both sides of a dispute: that is the news.
            text += f": {_batches(len(s.disputed))} disputed, you decide"
        elif by_the_gate and s.gate is not None and s.gate.worse_classes and not fell:
            # Why it was rejected, not a rise in the mean that did not save it.
            name, delta = min(s.gate.worse_classes.items(), key=lambda item: item[1])
            text += f": {name} IoU {delta:+.3f} ({scored_on(s.gate)})"
        elif self.outcome in {"accepted", "rejected"} and s.gate is not None and s.gate.miou is not None:
            change = f"{s.gate.miou_change:+.3f}, " if s.gate.miou_change is not None else ""
            text += f": mIoU {s.gate.miou:.3f} ({change}{scored_on(s.gate)})"
        if s.held:
            text += f", {_batches(len(s.held))} held"
        elif self.outcome in {"failed", "stopped"} and s.failed_state:
            text += f" at {s.failed_state}"
        # The dataset version only if it fits whole: the outcome and its numbers come first.
        versioned = f"{text} - {s.dataset_version}"
        return versioned if len(versioned) <= SUBJECT_LIMIT else _cut(text, SUBJECT_LIMIT)

    def data(self) -> str:
        s = self.s
        pairs = f"{s.pair_count} pairs" if s.pair_count is not None else "pairs unknown"
        if s.new_pairs is not None:
            pairs += f", {s.new_pairs} new since the accepted model" if s.baseline_run else f", {s.new_pairs} new"
        return f"{s.dataset_version} ({pairs})"

    def duration(self) -> str | None:
        return _duration(self.s.duration_seconds) if self.s.duration_seconds is not None else None

    def instances(self) -> str | None:
        job = self.s.job
        if job is None or job.instance_type is None:
            return None
        return f"{job.instance_count or 1} x {job.instance_type}" + (" (spot)" if job.spot else "")

    def cost(self) -> str | None:
        job = self.s.job
        if job is None or job.instance_type is None or job.billable_seconds is None:
            return None
        instance_seconds = job.billable_seconds * (job.instance_count or 1)
        dollars = estimated_cost(job.instance_type, instance_seconds)
        if dollars is None:
            return f"no estimate: no price known for {job.instance_type}"
        shown = f"about ${dollars:,.2f}" if dollars >= 0.01 else "less than $0.01"
        return (
            f"{shown} (an estimate: {instance_seconds / 3600:.2f} billable instance-hours at SageMaker's "
            "us-east-1 on-demand training list price, hand-recorded)"
        )

    def quality(self) -> str | None:
        """The gate's mIoU, its change against the accepted model, and the pairs both were scored on."""
        s, gate = self.s, self.s.gate
        miou = gate.miou if gate is not None and gate.miou is not None else s.miou
        if miou is None:
            return None
        if gate is not None and gate.baseline_miou is not None and gate.miou_change is not None:
            on = gate.compared_on or "the pairs both were scored on were not recorded"
            return f"{miou:.3f} ({gate.miou_change:+.3f} against the accepted model's {gate.baseline_miou:.3f}; {on})"
        text = f"{miou:.3f} on this run's validation split"
        if s.baseline_run is None:
            return text + " (the first model: nothing to compare with)"
        return text + " (not compared with the accepted model: see the quality gate)"

    def split_quality(self) -> str | None:
        """The whole validation split's mIoU, where the gate compared on trusted pairs instead.

        No change: it would need the accepted model's score on this same split, which the run
        summary does not hold, and a score on an earlier split is a score on other pairs."""
        s = self.s
        if s.miou is None or s.gate is None or _trusted_pairs(s.gate) is None:
            return None
        images = f"all {s.val_images} validation images" if s.val_images else "the whole validation split"
        return f"mIoU {s.miou:.3f} on {images}, new ones included (not compared: the gate compares on trusted pairs)"

    def worse(self) -> str | None:
        gate = self.s.gate
        if gate is None or not gate.worse_classes:
            return None
        ordered = sorted(gate.worse_classes.items(), key=lambda item: item[1])
        return ", ".join(f"{name} {delta:+.3f}" for name, delta in ordered) + f" ({scored_on(gate)})"

    def new_data(self) -> list[Entry]:
        """What screening decided about each new batch, worst first (`new_data.py`)."""
        pictures = f"{self.links.report.url}#new-data" if self.links.report else None
        return entries(self.s, pictures)

    def verdict(self) -> list[str]:
        gate = self.s.gate
        return list(gate.reasons) if gate is not None else []

    def issues(self) -> list[tuple[str, str]]:
        return [(rule.name, rules.advice(rule)) for rule in self.s.rules if rules.verdict(rule) == rules.ISSUES]

    def quiet_rules(self) -> str | None:
        """The rules with nothing to say, in one line."""
        return rules.summary_line(self.s.rules, self.s.rules_backend)

    def failure(self) -> tuple[str, str, list[str]] | None:
        s = self.s
        if s.error is None:
            return None
        lines = [line for line in (s.cause or "").strip().splitlines() if line.strip()][:CAUSE_LINES]
        return s.failed_state or "unknown", s.error, lines

    def link_list(self) -> list[tuple[str, str]]:
        links = self.links
        found: list[tuple[str, str | None]] = [
            ("Profiling report", links.report.url if links.report else links.report_console),
            ("Profiling report (console)", links.report_console if links.report else None),
            ("Run folder", links.run_folder),
            ("All runs (history)", links.history),
            ("Training job", links.training_job),
            ("Training logs", links.logs),
            ("Step Functions execution", links.execution),
        ]
        found += [(f"Batch report {link.label}", link.url) for link in links.batch_reports]
        return [(label, url) for label, url in found if url]

    def link_note(self) -> str | None:
        report = self.links.report
        if report is None:
            return None
        hours, rest = divmod(report.valid_seconds, 3600)
        lasts = f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min"
        return (
            f"The report link opens without AWS credentials until {report.expires_at:%Y-%m-%d %H:%M} UTC "
            f"({lasts}); then use the console link, or `retrain link {self.s.run}` for a fresh one."
        )

    # ------------------------------------------------------------- e-mail --
    def email(self) -> str:
        rows = [
            ("Run", self.s.run),
            ("Dataset version", self.data()),
            ("Duration", self.duration()),
            ("Instances", self.instances()),
            ("Cost", self.cost()),
            ("mIoU", self.quality()),
            ("Validation split", self.split_quality()),
            ("Got worse", self.worse()),
        ]
        lines = [f"{self.headline()}.", ""]
        lines += [f"{label + ':':<17} {value}" for label, value in rows if value]
        if self.verdict():
            lines += ["", "Quality gate: " + self.gate_word()]
            lines += [f"  - {reason}" for reason in self.verdict()]
        if self.new_data():
            lines += ["", "New data:"]
            lines += [f"  {line}" for entry in self.new_data() for line in entry]
        if self.issues():
            lines += ["", "Profiler rules that found issues:"]
            lines += [f"  - {name}: {advice}" for name, advice in self.issues()]
        if self.quiet_rules():
            lines += ["", str(self.quiet_rules())]
        failure = self.failure()
        if failure is not None:
            state, error, cause = failure
            lines += ["", f"Failed at:        {state}", f"Error:            {error}", "Cause:"]
            lines += [f"  {line}" for line in cause]
        lines += ["", "Links:"]
        lines += [f"  {label}: {url}" for label, url in self.link_list()]
        if self.links.more_batches:
            lines.append(f"  ... and {self.links.more_batches} more batch reports in the run's summary")
        if self.link_note():
            lines += ["", str(self.link_note())]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------- Slack --
    def slack(self) -> dict[str, Any]:
        header = f"{_ICONS[self.outcome]} {self.headline()}"
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(header, HEADER_LIMIT), "emoji": True}}
        ]
        fields = [
            ("Dataset version", self.data()),
            ("Duration", self.duration()),
            ("Instances", self.instances()),
            ("Estimated cost", self.cost()),
            ("mIoU", self.quality()),
            ("Validation split", self.split_quality()),
            ("Got worse", self.worse()),
        ]
        shown = [_mrkdwn(f"*{label}*\n{value}", FIELD_LIMIT) for label, value in fields if value][:10]
        blocks.append({"type": "section", "text": _mrkdwn(f"Run `{self.s.run}`"), "fields": shown})
        if self.verdict():
            text = f"*Quality gate: {self.gate_word()}*\n" + "\n".join(f"• {reason}" for reason in self.verdict())
            blocks.append({"type": "section", "text": _mrkdwn(text)})
        sections = _packed(["*New data*"], self.new_data(), SECTION_LIMIT)
        blocks += [{"type": "section", "text": _mrkdwn(text)} for text in sections[:MAX_DATA_SECTIONS]]
        if len(sections) > MAX_DATA_SECTIONS:
            blocks.append({"type": "section", "text": _mrkdwn("... more new data in the e-mail and the run's summary")})
        failure = self.failure()
        if failure is not None:
            state, error, cause = failure
            blocks.append({"type": "section", "text": _mrkdwn(f"*Failed at* {state}: `{error}`")})
            if cause:
                body = "\n".join(cause).replace("```", "'''")
                blocks.append({"type": "section", "text": _mrkdwn(f"```{_cut(body, SECTION_LIMIT - 6)}```")})
        issues = self.issues()
        for name, advice in issues[:MAX_RULE_SECTIONS]:
            blocks.append({"type": "section", "text": _mrkdwn(f":mag: *{name}* found issues\n{advice}")})
        if len(issues) > MAX_RULE_SECTIONS:
            more = ", ".join(name for name, _ in issues[MAX_RULE_SECTIONS:])
            blocks.append({"type": "section", "text": _mrkdwn(f"Also found issues: {more}")})
        notes = [note for note in (self.quiet_rules(), self.link_note()) if note]
        batches = [f"<{link.url}|{link.label}>" for link in self.links.batch_reports]
        if batches:
            extra = f" and {self.links.more_batches} more" if self.links.more_batches else ""
            notes.append("Batch reports: " + ", ".join(batches) + extra)
        if notes:
            blocks.append({"type": "context", "elements": [_mrkdwn(note) for note in notes[:10]]})
        buttons = [
            {"type": "button", "text": {"type": "plain_text", "text": _cut(label, BUTTON_LIMIT)}, "url": url}
            for label, url in self.link_list()
            if not label.startswith("Batch report") and len(url) <= SECTION_LIMIT
        ]
        if buttons:
            blocks.append({"type": "actions", "elements": buttons[:25]})
        if len(blocks) > MAX_BLOCKS:
            blocks = [*blocks[: MAX_BLOCKS - 1], blocks[-1]]
        return {"text": self.subject(), "blocks": blocks}


def scored_on(gate: GateVerdict) -> str:
    """The gate's pairs, short enough for a subject: "40 trusted pairs", or the split."""
    on = gate.compared_on or ""
    if (pairs := _trusted_pairs(gate)) is not None:
        return f"{pairs} trusted pairs"
    if "earlier validation split" in on:
        # The accepted model's recorded score: other pairs than this run's, and said so.
        return "validation split, vs a score on an earlier one"
    if not on and gate.baseline_miou is not None:
        return "pairs not recorded"  # a summary from before the gate named its pairs
    # Compared on the split, or not compared at all (the first model, a refusal): the gate's
    # mIoU is then the run's own, on its validation split.
    return "validation split"


def _trusted_pairs(gate: GateVerdict) -> int | None:
    if gate.trusted_pairs is not None:
        return gate.trusted_pairs
    found = TRUSTED_PAIRS.search(gate.compared_on or "")
    return int(found[1]) if found else None


def _packed(head: list[str], found: list[Entry], limit: int) -> list[str]:
    """Whole entries packed into texts of at most `limit` characters (one longer entry is cut)."""
    texts: list[str] = []
    current, filled = list(head), False
    for entry in found:
        if filled and len("\n".join([*current, *entry])) > limit:
            texts.append("\n".join(current))
            current = []
        current, filled = [*current, *entry], True
    if found:
        texts.append("\n".join(current))
    return texts


def _batches(count: int) -> str:
    return f"{count} batch{'' if count == 1 else 'es'}"


def _mrkdwn(text: str, limit: int = SECTION_LIMIT) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _cut(text, limit)}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"
