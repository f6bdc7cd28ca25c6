"""What the team reads: the SNS e-mail and the Slack message of each kind of run, held in golden
files (`UPDATE_GOLDEN=1 pytest tests/unit/test_notification_messages.py` rewrites them after a
deliberate change; read the diff before committing it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from functions.common.summary import GateVerdict, RuleVerdict
from functions.notify.render import render
from tests.unit.notify_cases import CASES, GPU_RULES, failed_in_training, links_for, on_a_cpu_host, with_rule_issues

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


def test_a_subject_says_the_outcome_at_a_glance_in_at_most_100_characters() -> None:
    subjects = {case: render(make(), links_for(make())).subject for case, make in CASES.items()}

    assert subjects["accepted"].startswith("Retraining accepted: mIoU 0.718 (+0.016)")
    assert subjects["rejected"].startswith("Retraining rejected by the quality gate: mIoU 0.681 (-0.021)")
    assert subjects["failed_in_training"].startswith("Retraining failed at Check the training job")
    assert all(len(subject) <= 100 for subject in subjects.values())


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
            ),
        }
    )

    subject = render(summary, links_for(summary)).subject
    assert subject.startswith("Retraining rejected by the quality gate: road IoU -0.100 - "), subject
    assert "+0.049" not in subject
