"""The runs' history page (`reports/index.html`) as the teams read it across runs.

Slow poisoning: a team whose drops each pass the screen, with a little more wrong every time,
is named at the top of the page; a team whose share of likely label errors merely wobbles is not.
Numbers that agree: the mIoU column is the gate's and names the pairs it was scored on.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from functions.common.contracts import ScreenedBatchSummary, ScreeningSummary
from functions.common.summary import GateVerdict, RunArtifacts, RunSummary
from functions.evaluate_run import history

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
TRUSTED = "both scored on 40 trusted validation pairs of 2 batches"


def _run(week: int, screened: dict[str, tuple[str, int, int]], **changes: object) -> RunSummary:
    """The run of week `week`, whose screening judged `screened`: batch -> (team, judged, contradicted)."""
    name = f"ds-202611{week:02d}-090000-0000000{week}"
    summary = RunSummary(
        run=name,
        outcome="accepted",
        dataset_version=name,
        finished_at=START + timedelta(weeks=week),
        miou=0.465,
        artifacts=RunArtifacts(
            folder=f"s3://b/reports/runs/{name}/", summary=f"s3://b/reports/runs/{name}/summary.json"
        ),
        screening=ScreeningSummary(
            screened=True,
            calibration="independent",
            batches={
                batch: ScreenedBatchSummary(
                    team=team, pair_count=judged, judged=judged, contradicted=wrong, verdict="pairs left out"
                )
                for batch, (team, judged, wrong) in screened.items()
            },
        ),
    )
    return summary.model_copy(update=changes)


def _weeks() -> list[RunSummary]:
    """Munich's drops: 2 %, 4 %, 9 % of their judged pairs contradicted, each under the screen's
    limits. Berlin's: 3 %, 2 %, 3 %, the usual noise of a careful team."""
    return [
        _run(1, {"munich-w1": ("munich", 200, 4), "berlin-w1": ("berlin", 100, 3)}),
        _run(2, {"munich-w2": ("munich", 200, 8), "berlin-w2": ("berlin", 100, 2)}),
        _run(3, {"munich-w3": ("munich", 200, 18), "berlin-w3": ("berlin", 100, 3)}),
    ]


def _warning(page: str) -> str:
    found = re.search(r"<p class='warning' id='drift'>(.*?)</p>", page)
    return found[1] if found else ""


def _team_row(page: str, team: str) -> str:
    found = re.search(rf"<tr><td>{team}</td>(.*?)</tr>", page)
    assert found, f"no row for team {team} under 'Likely label errors by team'"
    return found[1]


def test_a_team_whose_label_errors_rise_drop_after_drop_is_named_at_the_top() -> None:
    page = history.render(_weeks())

    warning = _warning(page)
    assert "munich" in warning, "Munich's rising share of likely label errors is not called out at the top"
    assert "2 % → 4 % → 9 %" in warning, warning
    assert "berlin" not in warning, "Berlin's steady share is named as a drift"
    assert page.index("id='drift'") < page.index("<table>"), "the warning is not at the top of the page"
    munich = _team_row(page, "munich")
    assert munich.index("munich-w1: 2 %") < munich.index("munich-w2: 4 %") < munich.index("munich-w3: 9 %"), (
        f"Munich's drops are not shown oldest to newest: {munich}"
    )
    assert "ds-20261103-090000-00000003" in munich, "each drop names the run that screened it"
    assert "drifting upward" in munich and "drifting upward" not in _team_row(page, "berlin")
    assert "<script" not in page, "the page must stay self-contained, without script"


def test_steady_small_or_short_rises_are_not_drift() -> None:
    too_small = [
        _run(1, {"koeln-w1": ("koeln", 1000, 5)}),
        _run(2, {"koeln-w2": ("koeln", 1000, 10)}),
        _run(3, {"koeln-w3": ("koeln", 1000, 20)}),  # doubling every time, but 2 %: noise
    ]
    too_short = [_run(1, {"bonn-w1": ("bonn", 100, 2)}), _run(2, {"bonn-w2": ("bonn", 100, 9)})]
    fell_last = [*_weeks()[:2], _run(3, {"munich-w3": ("munich", 200, 6)})]  # 2 %, 4 %, 3 %

    for story, runs in {"under 5 %": too_small, "two drops": too_short, "fell at the newest": fell_last}.items():
        page = history.render(runs)
        assert not _warning(page), f"{story}: named as a drift: {_warning(page)}"


def test_a_drop_counts_once_at_the_first_screening_that_judged_it() -> None:
    """Munich's third drop was not judged first (fog), then judged by the next run; its share
    counts once, and a later re-screening of an older drop does not add a point."""
    runs = [
        *_weeks()[:2],
        _run(3, {"munich-w3": ("munich", 0, 0)}),
        _run(4, {"munich-w3": ("munich", 200, 18), "munich-w1": ("munich", 200, 0)}),
    ]

    drops = history.team_drops(runs)["munich"]

    assert [(d.batch, d.run) for d in drops] == [
        ("munich-w1", runs[0].run),
        ("munich-w2", runs[1].run),
        ("munich-w3", runs[3].run),
    ], drops
    assert "munich" in _warning(history.render(runs))


def test_the_mIoU_column_is_the_gates_and_names_the_pairs_it_was_scored_on() -> None:
    """The gate's 0.602 (+0.136) on 40 trusted pairs, and the whole split's 0.465: two columns,
    each saying what it is, and only the gate's with a change."""
    gate = GateVerdict(
        accepted=True,
        reasons=["ok"],
        miou=0.602,
        baseline_miou=0.466,
        miou_change=0.136,
        miou_tolerance=0.01,
        class_tolerance=0.05,
        compared_on=TRUSTED,
    )
    page = history.render([_run(1, {}, gate=gate)])

    assert "<th>mIoU (gate's pairs)</th><th>mIoU (whole validation split)</th>" in page
    assert f"<td>0.602 (+0.136)<br><span class='muted'>{TRUSTED}</span></td><td>0.465</td>" in page, (
        "the gate's mIoU, its change and its pairs in one cell, the split's mIoU without a change beside it"
    )
    assert "Likely label errors by team" in page
