"""What the team reads: the SNS e-mail and the Slack message of each kind of run, held in golden
files (`UPDATE_GOLDEN=1 pytest tests/unit/test_notification_messages.py` rewrites them after a
deliberate change; read the diff before committing it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from functions.common.summary import GateVerdict, RuleVerdict, RunSummary
from functions.notify import new_data
from functions.notify.render import SUBJECT_LIMIT, Rendered, render
from tests.unit.notify_cases import (
    CASES,
    GPU_RULES,
    SPLIT_MIOU,
    TRUSTED,
    accepted,
    failed_in_training,
    links_for,
    on_a_cpu_host,
    with_a_dispute,
    with_a_held_batch,
    with_pairs_left_out,
    with_rule_issues,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "notify"


def _golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1 once, and read what it wrote"
    assert actual == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_ending_reads_as_its_golden_email_and_slack_message(case: str) -> None:
    summary = CASES[case]()

    message = render(summary, links_for(summary))

    _golden(f"{case}.email.txt", f"Subject: {message.subject}\n\n{message.text}")
    _golden(f"{case}.slack.json", json.dumps(message.slack, indent=2, ensure_ascii=False) + "\n")


def _told(summary: RunSummary) -> Rendered:
    return render(summary, links_for(summary))


def _row(text: str, label: str) -> str:
    """The e-mail's `label:` row (the facts at the top of the body), or "" when it has none."""
    return next((line for line in text.splitlines() if line.startswith(f"{label}:")), "")


def test_a_subject_says_the_outcome_at_a_glance_in_at_most_100_characters() -> None:
    subjects = {case: _told(make()).subject for case, make in CASES.items()}

    assert subjects["accepted"].startswith("Retraining accepted: mIoU 0.718 (+0.016, 120 trusted pairs)")
    assert subjects["rejected"].startswith(
        "Retraining rejected by the quality gate: mIoU 0.681 (-0.021, 120 trusted pairs)"
    )
    assert subjects["failed_in_training"].startswith("Retraining failed at Check the training job")
    too_long = {case: subject for case, subject in subjects.items() if len(subject) > SUBJECT_LIMIT}
    assert not too_long, f"SNS refuses subjects over {SUBJECT_LIMIT} characters: {too_long}"


def test_the_subject_and_the_body_give_the_gates_mIoU_on_the_pairs_it_names() -> None:
    """The gate compared both models on 120 trusted pairs (0.718 against 0.702); the whole
    validation split, a harder drop included, gives 0.691. The message once read "mIoU: 0.691
    (+0.016 against the accepted model's 0.702)": two numbers from two sets of pairs."""
    summary = accepted()

    told = _told(summary)

    assert "mIoU 0.718 (+0.016, 120 trusted pairs)" in told.subject, told.subject
    quality = _row(told.text, "mIoU")
    assert quality.endswith(f"0.718 (+0.016 against the accepted model's 0.702; {TRUSTED})"), (
        f"the body's mIoU is not the gate's on the pairs it names: {quality!r}"
    )
    split = _row(told.text, "Validation split")
    assert f"mIoU {SPLIT_MIOU:.3f} on all 1248 validation images" in split, (
        f"the whole split's mIoU is not named as such: {split!r}"
    )
    assert "+" not in split and "-0" not in split and "against" not in split, (
        f"the split's mIoU is compared with a score on other pairs: {split!r}"
    )
    assert f"{SPLIT_MIOU:.3f} (" not in told.text, "the split's mIoU stands beside a change"
    assert _row(told.text, "Got worse").endswith("person -0.012 (120 trusted pairs)")
    fields = [field["text"] for field in told.slack["blocks"][1]["fields"]]
    assert f"*mIoU*\n{quality.split(maxsplit=1)[1]}" in fields, f"Slack's mIoU is not the e-mail's: {fields}"
    assert f"*Validation split*\n{split.split(maxsplit=2)[2]}" in fields, f"Slack's split is not the e-mail's: {fields}"
    assert told.slack["text"] == told.subject


def test_a_first_model_and_a_run_compared_on_the_split_say_so() -> None:
    gate = accepted().gate
    assert gate is not None
    first = accepted().model_copy(
        update={
            "baseline_run": None,
            "gate": gate.model_copy(
                update={"miou": SPLIT_MIOU, "baseline_miou": None, "miou_change": None, "compared_on": None}
            ),
        }
    )
    on_the_split = accepted().model_copy(
        update={
            "gate": gate.model_copy(
                update={
                    "miou": SPLIT_MIOU,
                    "miou_change": -0.0116,
                    "compared_on": "both scored on this run's validation split, as no pair is trusted yet",
                }
            )
        }
    )

    told_first, told_split = _told(first), _told(on_the_split)

    assert "mIoU 0.691 (validation split)" in told_first.subject, told_first.subject
    assert _row(told_first.text, "mIoU").endswith(
        "0.691 on this run's validation split (the first model: nothing to compare with)"
    )
    assert "mIoU 0.691 (-0.012, validation split)" in told_split.subject, told_split.subject
    assert _row(told_split.text, "mIoU").endswith("as no pair is trusted yet)")
    assert not _row(told_split.text, "Validation split"), "the gate's mIoU is the split's already: said once"


def test_the_report_link_states_truthfully_until_when_it_works() -> None:
    summary = with_rule_issues()

    text = render(summary, links_for(summary)).text

    assert "until 2026-12-03 11:01 UTC (59 min)" in text
    assert "retrain link ds-20261203-091500-4f1c2a9b" in text


def test_rules_with_nothing_to_judge_say_so_and_are_not_counted_as_passed() -> None:
    summary = on_a_cpu_host()

    message = render(summary, links_for(summary))

    # 12 rules: 6 GPU rules and DataStall had nothing to judge; 5 judged and found nothing.
    line = next(line for line in message.text.splitlines() if line.startswith("Profiler rules"))
    assert "5 of 12 rules found nothing to report" in line, line
    assert f"{', '.join(GPU_RULES)} not applicable on this host: no GPU metrics on this run" in line, line
    assert "DataStall not applicable on this host: only 3 training steps" in line, line
    assert line in _texts(message.slack["blocks"]), "Slack says the same"
    assert ":mag:" not in json.dumps(message.slack), "not applicable is no issue either"


def _texts(block: Any) -> list[str]:
    if isinstance(block, dict):
        found = [block["text"]] if isinstance(block.get("text"), str) else []
        return found + [text for value in block.values() for text in _texts(value)]
    if isinstance(block, list):
        return [text for item in block for text in _texts(item)]
    return []


def test_block_kit_limits_hold_whatever_the_run_produced() -> None:
    classes = {f"class-{index:03d}": -0.2 for index in range(120)}
    summary = failed_in_training().model_copy(
        update={
            "dataset_version": "ds-" + "x" * 77,
            "new_batches": [f"batch-{index}" for index in range(40)],
            "cause": "\n".join(f"line {index}: " + "y" * 900 for index in range(40)),
            "gate": GateVerdict(
                accepted=False,
                reasons=["z" * 5000 for _ in range(20)],
                miou=0.1,
                baseline_miou=0.5,
                miou_change=-0.4,
                worse_classes=classes,
                miou_tolerance=0.01,
                class_tolerance=0.05,
            ),
            "miou": 0.1,
            "rules_backend": "builtin",
            "rules": [
                RuleVerdict(name=f"Rule{index}", status="IssuesFound", recommendation="r" * 4000) for index in range(60)
            ],
        }
    )

    message = render(summary, links_for(summary))
    blocks = message.slack["blocks"]

    assert len(message.subject) <= 100
    assert len(blocks) <= 50
    assert blocks[0]["type"] == "header" and len(blocks[0]["text"]["text"]) <= 150
    for block in blocks:
        assert len(block.get("fields", [])) <= 10
        assert all(len(field["text"]) <= 2000 for field in block.get("fields", []))
        if block["type"] == "section":
            assert len(block["text"]["text"]) <= 3000
        if block["type"] == "context":
            assert len(block["elements"]) <= 10
        if block["type"] == "actions":
            assert len(block["elements"]) <= 25
            assert all(len(b["text"]["text"]) <= 75 and len(b["url"]) <= 3000 for b in block["elements"])
    assert all(len(text) <= 3000 for text in _texts(blocks))
    assert "Also found issues: Rule10" in json.dumps(blocks), "surplus rules are summarised, not dropped silently"


def test_a_model_rejected_for_one_class_says_that_class_not_its_better_mean() -> None:
    """The poisoned-drop story: mIoU rose, road fell; "(+0.049)" in the subject read as good news."""
    summary = CASES["rejected"]().model_copy(
        update={
            "miou": 0.372,
            "gate": GateVerdict(
                accepted=False,
                reasons=["road IoU fell by 0.100: more than the 0.050 allowed"],
                miou=0.372,
                baseline_miou=0.323,
                miou_change=0.049,
                worse_classes={"road": -0.1, "sky": -0.01},
                miou_tolerance=0.01,
                class_tolerance=0.05,
                compared_on="both scored on 40 trusted validation pairs of 2 batches",
            ),
        }
    )

    subject = render(summary, links_for(summary)).subject
    assert subject.startswith("Retraining rejected by the quality gate: road IoU -0.100 (40 trusted pairs)"), subject
    assert "+0.049" not in subject


def _slack_text(told: Rendered) -> str:
    return "\n".join(_texts(told.slack["blocks"]))


def _new_data(told: Rendered) -> list[str]:
    """The e-mail's "New data:" lines, unindented."""
    lines = told.text.split("\nNew data:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.strip() for line in lines]


def _held_with_pictures(mode: str) -> RunSummary:
    summary = with_a_held_batch()
    assert summary.screening is not None
    return summary.model_copy(update={"screening": summary.screening.model_copy(update={"pictures": mode})})


def test_a_held_batchs_blurred_pictures_are_said_to_be_blurred() -> None:
    lines = _new_data(_told(_held_with_pictures("blur")))

    assert lines[4].startswith("its worst pairs, pictured (blurred: faces and number plates cannot be read): https://")


def test_with_pictures_omitted_a_held_batch_links_no_pictures_and_says_why() -> None:
    told = _told(_held_with_pictures("omit"))

    lines = _new_data(told)

    assert lines[4] == (
        "not pictured (HeldPairPictures omit: the images show people); its pairs to fix: "
        "reports/batches/team-b/report.md"
    ), lines[4]
    assert "#new-data" not in told.text and "#new-data" not in _slack_text(told)


def test_a_held_batch_says_why_where_its_pictures_are_and_how_to_release_or_erase_it() -> None:
    told = _told(with_a_held_batch())

    lines = _new_data(told)

    assert lines[0] == "team-b: HELD, left out of this run and of every later dataset version", lines
    assert lines[1].startswith("62.4 % of its labelled pixels contradict the accepted model"), "the top reason first"
    assert lines[4].startswith("its worst pairs, pictured: https://") and lines[4].endswith("#new-data"), lines[4]
    assert lines[5] == (
        'labels right after all? `retrain data release team-b --reason "..."`, '
        "or erase it: `retrain data purge team-b/`"
    ), lines[5]
    assert lines[-1] == "Now trusted: team-c-night (31 pairs)", lines
    assert ", 1 batch held" in told.subject, told.subject
    assert all(line in _slack_text(told) for line in lines), "Slack says the same"


def test_pairs_left_out_name_their_team_and_where_the_relabel_list_is() -> None:
    """Munich's drop had 12 pairs the model contradicts: those wait for Munich to fix them, the
    rest trained on. Berlin's fog scenes the model cannot judge: trained on, not trusted."""
    told = _told(with_pairs_left_out())

    lines = _new_data(told)

    assert lines == [
        "munich-2026-12-01: 12 pairs left out for munich to fix: the relabel list is in "
        "reports/batches/munich-2026-12-01/report.md",
        "hamburg-2026-12-02: 1 pair left out for hamburg to fix: the relabel list is in "
        "reports/batches/hamburg-2026-12-02/report.md",
        "berlin-fog-03: not judged: trained on, not trusted: the next accepted model screens it again",
        "Now trusted: munich-2026-12-01 (224 pairs), hamburg-2026-12-02 (147 pairs)",
    ], "the new data, worst first, each line saying what happens next"
    assert told.subject.startswith("Retraining accepted: mIoU 0.718 (+0.016, 120 trusted pairs)"), told.subject
    assert all(line in _slack_text(told) for line in lines), "Slack says the same"


def test_a_dispute_tells_the_operator_what_to_decide_and_how() -> None:
    """Nobody checked Munich's labels or Hamburg's, and they contradict each other: the gate
    refuses the run, and the message gives the two commands that settle it."""
    told = _told(with_a_dispute())

    lines = _new_data(told)

    assert told.subject.startswith("Retraining rejected by the quality gate: 1 batch disputed, you decide"), (
        told.subject
    )
    assert lines[0] == "hamburg-2026-12-02: DISPUTED, trained on, not trusted; no run is accepted until you decide"
    assert lines[1].startswith("disputed: it contradicts the provisional model trained on munich-2026-12-01")
    assert (
        "decide: name a benchmark of labels checked by hand: "
        '`retrain data benchmark hamburg-2026-12-02 --reason "..." --checked-by-hand`'
    ) in lines, lines
    assert any(
        line.startswith('or hold the wrong side: `retrain data hold hamburg-2026-12-02 --reason "..."`')
        for line in lines
    ), lines
    assert _row(told.text, "mIoU").endswith(
        "0.691 on this run's validation split (not compared with the accepted model: see the quality gate)"
    ), "the gate stopped at the dispute: no change, and the pairs named"
    assert all(line in _slack_text(told) for line in lines), "Slack says the same"


def test_new_data_comes_worst_first_held_left_out_disputed_not_judged_impact_trusted() -> None:
    left_out, disputed, held = with_pairs_left_out(), with_a_dispute(), with_a_held_batch()
    summary = held.model_copy(
        update={
            "left_out": left_out.left_out,
            "not_judged": left_out.not_judged,
            "disputed": disputed.disputed,
            "trusted_pairs": left_out.trusted_pairs,
        }
    )

    lines = _new_data(_told(summary))

    def first(start: str) -> int:
        found = [index for index, line in enumerate(lines) if line.startswith(start)]
        assert found, f"no line starts with {start!r}: {lines}"
        return found[0]

    order = [
        first("team-b: HELD"),
        first("munich-2026-12-01: 12 pairs left out"),
        first("hamburg-2026-12-02: DISPUTED"),
        first("berlin-fog-03: not judged"),
        first("team-a (trusted, 24 validation pairs)"),
        first("Now trusted:"),
    ]
    assert order == sorted(order), f"not worst first: {lines}"


def test_a_hundred_held_batches_keep_the_message_short() -> None:
    held = {
        f"team-{index:03d}": ["labelled sky where the model sees road: 87 % of those pixels"] * 5
        for index in range(100)
    }
    summary = with_a_held_batch().model_copy(update={"held": held, "not_judged": [f"fog-{i}" for i in range(40)]})

    told = _told(summary)
    lines = _new_data(told)

    described = [
        line for line in lines if line.endswith(": HELD, left out of this run and of every later dataset version")
    ]
    assert len(described) == new_data.MAX_DESCRIBED, f"{len(described)} held batches described line by line"
    assert any(line.startswith("... and 95 more held: team-005, ") for line in lines), lines
    assert any(line.startswith("... and 35 more not judged: fog-5, ") for line in lines), lines
    assert len(lines) < 60, f"{len(lines)} lines of new data"
    sections = [block for block in told.slack["blocks"] if block["type"] == "section"]
    assert len(told.slack["blocks"]) <= 50 and all(len(block["text"]["text"]) <= 3000 for block in sections)
    assert "`retrain data release team-004 --reason" in _slack_text(told), "no command is cut in half in Slack"
