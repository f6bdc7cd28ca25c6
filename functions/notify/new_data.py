"""A message's new-data part: what screening decided about each new batch, worst first.

In order of severity: batches HELD whole (why, their pictured pairs, how to release or erase
them); pairs left out for their team to fix (where the relabel list is); DISPUTED batches (the
operator decides which labels are right, and how); batches not judged (trained on, not trusted);
then each batch's impact on the model, and the batches whose pairs earned trust. Each command a
line names can be pasted as it is, once the operator has written the reason in. An e-mail has a
line budget: each kind describes at most `MAX_DESCRIBED` batches and names the rest in one line
(the run's summary.json has them all).

The lines are grouped into entries (a batch's first line and the indented lines under it), so
Slack can pack whole entries into its sections instead of cutting a command in half.
"""

from __future__ import annotations

from collections.abc import Callable

from functions.common import prefixes
from functions.common.contracts import team_of
from functions.common.summary import RunSummary

MAX_DESCRIBED = 5  # batches of one kind a message describes line by line
MAX_REASONS = 3  # the reasons shown per held or disputed batch (the report has them all)
MAX_IMPACT_LINES = 8  # batches whose impact a message lists
MAX_NAMED = 10  # batches named in one line ("Now trusted: ...")
MOVED = 0.01  # a class moved on a batch when its IoU changed by at least this
INDENT = "    "
REASON = '--reason "..."'  # the operator writes why: the ledger keeps it

Entry = list[str]


def entries(summary: RunSummary, pictures: str | None) -> list[Entry]:
    """Every entry of the new-data part; `pictures` is the report's `#new-data` link, if any."""
    s = summary
    found: list[Entry] = []
    mode = s.screening.pictures if s.screening is not None else "show"
    found += _described(list(s.held), lambda batch: _held(batch, s.held[batch], pictures, mode), "held")
    left_out = [batch for batch, count in s.left_out.items() if count and batch not in s.held]
    found += _described(left_out, lambda batch: [_left_out(s, batch)], "with pairs left out")
    found += _described(list(s.disputed), lambda batch: _disputed(batch, s.disputed[batch]), "disputed")
    found += _described(list(s.not_judged), lambda batch: [_not_judged(batch)], "not judged")
    if s.screening is not None and not s.screening.screened:
        found.append([f"Not screened: {s.screening.why}"])
    found += [[line] for line in _impacts(s)]
    trusted = _trusted(s)
    if trusted:
        found.append([trusted])
    return found


def lines(summary: RunSummary, pictures: str | None) -> list[str]:
    return [line for entry in entries(summary, pictures) for line in entry]


def _described(batches: list[str], describe: Callable[[str], Entry], kind: str) -> list[Entry]:
    shown = [describe(batch) for batch in batches[:MAX_DESCRIBED]]
    rest = batches[MAX_DESCRIBED:]
    if rest:
        shown.append([f"... and {len(rest)} more {kind}: {_names(rest)} (the run's summary.json has them all)"])
    return shown


def _held(batch: str, reasons: list[str], pictures: str | None, mode: str) -> Entry:
    entry = [f"{batch}: HELD, left out of this run and of every later dataset version"]
    entry += [INDENT + reason for reason in reasons[:MAX_REASONS]]
    if mode == "omit":
        # The images show faces and number plates: this stack keeps them out of reports and links.
        entry.append(
            f"{INDENT}not pictured (HeldPairPictures omit: the images show people); its pairs to fix: "
            f"{prefixes.report_key(batch, 'report.md')}"
        )
    elif pictures:
        blurred = " (blurred: faces and number plates cannot be read)" if mode == "blur" else ""
        entry.append(f"{INDENT}its worst pairs, pictured{blurred}: {pictures}")
    entry.append(
        f"{INDENT}labels right after all? `retrain data release {batch} {REASON}`, "
        f"or erase it: `retrain data purge {batch}/`"
    )
    return entry


def _left_out(summary: RunSummary, batch: str) -> str:
    count = summary.left_out[batch]
    screened = summary.screening.batches.get(batch) if summary.screening is not None else None
    team = screened.team if screened is not None and screened.team else team_of(batch)
    return (
        f"{batch}: {count} pair{'' if count == 1 else 's'} left out for {team} to fix: "
        f"the relabel list is in {prefixes.report_key(batch, 'report.md')}"
    )


def _disputed(batch: str, reasons: list[str]) -> Entry:
    # Neither side's labels were checked by anyone: only a person can say which is right, and
    # until then no run trained on both is accepted (the gate refuses it).
    entry = [f"{batch}: DISPUTED, trained on, not trusted; no run is accepted until you decide"]
    entry += [INDENT + reason for reason in reasons[:MAX_REASONS]]
    entry.append(
        f"{INDENT}decide: name a benchmark of labels checked by hand: "
        f"`retrain data benchmark {batch} {REASON} --checked-by-hand`"
    )
    entry.append(
        f"{INDENT}or hold the wrong side: `retrain data hold {batch} {REASON}` (or the batches the model learned from)"
    )
    return entry


def _not_judged(batch: str) -> str:
    return f"{batch}: not judged: trained on, not trusted: the next accepted model screens it again"


def _impacts(summary: RunSummary) -> list[str]:
    """Each trained batch's validation pairs under both models: the same pairs, so a fair change."""
    found = []
    for batch, scores in list(summary.batch_scores.items())[:MAX_IMPACT_LINES]:
        if scores.held or scores.candidate is None:
            continue
        line = f"{batch} ({scores.trust}, {scores.val_pairs} validation pairs): mIoU {scores.candidate.miou:.3f}"
        if scores.accepted is not None:
            line += f" against the accepted model's {scores.accepted.miou:.3f}"
            moved = _moved(scores.candidate.per_class_iou, scores.accepted.per_class_iou)
            line += f"; {moved}" if moved else ""
        found.append(line)
    return found


def _trusted(summary: RunSummary) -> str | None:
    # trusted_pairs counts each batch's pairs; summaries written before it name the batches only.
    counted = summary.trusted_pairs or dict.fromkeys(summary.newly_trusted, 0)
    if not counted:
        return None
    named = [
        f"{batch} ({count} pair{'' if count == 1 else 's'})" if count else batch
        for batch, count in list(counted.items())[:MAX_NAMED]
    ]
    more = f" and {len(counted) - MAX_NAMED} more" if len(counted) > MAX_NAMED else ""
    return f"Now trusted: {', '.join(named)}{more}"


def _names(batches: list[str]) -> str:
    more = f" and {len(batches) - MAX_NAMED} more" if len(batches) > MAX_NAMED else ""
    return ", ".join(batches[:MAX_NAMED]) + more


def _moved(new: dict[str, float | None], old: dict[str, float | None]) -> str:
    """'road +0.052, sky -0.031': the classes whose IoU moved by 0.01 or more, largest first."""
    changes = [
        (name, value - before)
        for name, value in new.items()
        if value is not None and (before := old.get(name)) is not None
    ]
    changes = sorted((c for c in changes if abs(c[1]) >= MOVED), key=lambda c: -abs(c[1]))
    return ", ".join(f"{name} {delta:+.3f}" for name, delta in changes[:4])
