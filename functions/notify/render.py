"""One renderer, two channels: a run summary as an e-mail (SNS) and as a Slack Block Kit message.

Both say the same things, in the same order: the outcome; the data (dataset version, pairs, new
pairs since the last run); duration, instances and an estimated cost; mIoU with its change and
the classes that got worse; each profiler rule that found issues, with what to do (the rest in one
line); for a failure, where, the error and the first lines of the cause; then the links. Slack's
limits (50 blocks, 3,000 characters a section, 10 fields, 75 a button label) hold whatever the run
produced: long texts are cut with an ellipsis, surplus rules summarised.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from functions.common import rules
from functions.common.prices import estimated_cost
from functions.common.summary import RunSummary
from functions.notify.links import RunLinks

SUBJECT_LIMIT = 100  # SNS refuses longer subjects
CAUSE_LINES = 8
MAX_BLOCKS = 50
SECTION_LIMIT = 3000
FIELD_LIMIT = 2000
HEADER_LIMIT = 150
BUTTON_LIMIT = 75
MAX_RULE_SECTIONS = 10
MAX_IMPACT_LINES = 8  # batches whose impact a message lists (the report has them all)
MOVED = 0.01  # a class moved on a batch when its IoU changed by at least this

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
        if by_the_gate and s.gate is not None and s.gate.worse_classes and not fell:
            # Why it was rejected, not a rise in the mean that did not save it.
            name, delta = min(s.gate.worse_classes.items(), key=lambda item: item[1])
            text += f": {name} IoU {delta:+.3f}"
        elif self.outcome in {"accepted", "rejected"} and s.miou is not None:
            change = s.gate.miou_change if s.gate else None
            miou = s.gate.miou if s.gate and s.gate.miou is not None else s.miou
            text += f": mIoU {miou:.3f}" + (f" ({change:+.3f})" if change is not None else "")
        if s.held:
            text += f", {len(s.held)} batch{'es' if len(s.held) > 1 else ''} held"
        elif self.outcome in {"failed", "stopped"} and s.failed_state:
            text += f" at {s.failed_state}"
        return _cut(f"{text} - {s.dataset_version}", SUBJECT_LIMIT)

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
        s = self.s
        if s.miou is None:
            return None
        text = f"{s.miou:.3f}"
        gate = s.gate
        if gate is not None and gate.baseline_miou is not None and gate.miou_change is not None:
            text += f" ({gate.miou_change:+.3f} against the accepted model's {gate.baseline_miou:.3f})"
        elif s.baseline_run is None:
            text += " (the first model: nothing to compare with)"
        return text

    def worse(self) -> str | None:
        gate = self.s.gate
        if gate is None or not gate.worse_classes:
            return None
        ordered = sorted(gate.worse_classes.items(), key=lambda item: item[1])
        return ", ".join(f"{name} {delta:+.3f}" for name, delta in ordered)

    def new_data(self) -> list[str]:
        """What screening held (with where to look and how to release it), each drop's impact,
        and the batches that earned trust."""
        s, lines = self.s, []
        pictures = f"{self.links.report.url}#new-data" if self.links.report else None
        for batch, reasons in s.held.items():
            lines.append(f"{batch}: HELD, left out of this run and of every later dataset version")
            lines += [f"    {reason}" for reason in reasons[:3]]
            if pictures:
                lines.append(f"    its worst pairs, pictured: {pictures}")
            lines.append(f"    labels right after all? `retrain data release {batch}`")
        if s.screening is not None and not s.screening.screened:
            lines.append(f"Not screened: {s.screening.why}")
        for batch, scores in list(s.batch_scores.items())[:MAX_IMPACT_LINES]:
            if scores.held or scores.candidate is None:
                continue
            line = f"{batch} ({scores.trust}, {scores.val_pairs} validation pairs): mIoU {scores.candidate.miou:.3f}"
            if scores.accepted is not None:
                line += f" against the accepted model's {scores.accepted.miou:.3f}"
                moved = _moved(scores.candidate.per_class_iou, scores.accepted.per_class_iou)
                line += f"; {moved}" if moved else ""
            lines.append(line)
        if s.newly_trusted:
            lines.append(f"Now trusted (the next gate judges on their validation pairs): {', '.join(s.newly_trusted)}")
        return lines

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
            ("Got worse", self.worse()),
        ]
        lines = [f"{self.headline()}.", ""]
        lines += [f"{label + ':':<17} {value}" for label, value in rows if value]
        if self.verdict():
            lines += ["", "Quality gate: " + self.gate_word()]
            lines += [f"  - {reason}" for reason in self.verdict()]
        if self.new_data():
            lines += ["", "New data:"]
            lines += [f"  {line}" for line in self.new_data()]
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
            ("Got worse", self.worse()),
        ]
        shown = [_mrkdwn(f"*{label}*\n{value}", FIELD_LIMIT) for label, value in fields if value][:10]
        blocks.append({"type": "section", "text": _mrkdwn(f"Run `{self.s.run}`"), "fields": shown})
        if self.verdict():
            text = f"*Quality gate: {self.gate_word()}*\n" + "\n".join(f"• {reason}" for reason in self.verdict())
            blocks.append({"type": "section", "text": _mrkdwn(text)})
        if self.new_data():
            blocks.append({"type": "section", "text": _mrkdwn("*New data*\n" + "\n".join(self.new_data()))})
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


def _moved(new: dict[str, float | None], old: dict[str, float | None]) -> str:
    """'road +0.052, sky -0.031': the classes whose IoU moved by 0.01 or more, largest first."""
    changes = [
        (name, value - before)
        for name, value in new.items()
        if value is not None and (before := old.get(name)) is not None
    ]
    changes = sorted((c for c in changes if abs(c[1]) >= MOVED), key=lambda c: -abs(c[1]))
    return ", ".join(f"{name} {delta:+.3f}" for name, delta in changes[:4])


def _mrkdwn(text: str, limit: int = SECTION_LIMIT) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _cut(text, limit)}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"
