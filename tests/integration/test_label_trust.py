"""A good drop, then a drop with a quarter of its pairs swapped and its people left unlabelled,
then another good drop, on the offline stack (issue 34).

Team munich's good drop trains the first model: nothing judges it, so nothing becomes trusted.
Team berlin exports a drop in which every person was left unlabelled (painted as the sidewalk or
road behind them) and eight of its 32 masks carry the wrong class map. People are about 2 % of
the pixels, which no batch-wide share sees: the run that screens it names the erased class and
holds the batch, and lists its pairs to fix worst first (the swapped ones on top, pictured), in
the message, the run's report and the team's batch report. Team zurich's good drop follows: it
agrees with the model, which corroborates it (two teams' labels agree), so its pairs earn trust,
and its run is accepted by a gate that scored no held pair.

Everything runs for real: the intake, the trigger, the state machine on moto's engine, the trainer
under torchrun (screening, training, evaluation), the evaluation's trust records. The first
model trains longer on larger scenes than other tests' (about 100 s here), so that it sees people
well enough to be allowed to judge them (`Rule.competence`); the gate's tolerances are loose
(template parameters): this test is about which pairs are judged, not by how much.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.common.contracts import MetricsFile, parse_manifest
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import audit
from tests.integration.trust_drops import (
    SWAP,
    drop,
    fetch,
    later_runs,
    next_run,
    read,
    screening_of,
    summary_of,
    trust_stack,
)

# Three trainings (one of 30 epochs on 192x96 scenes), screening and evaluation: about 220 s on 2 cores.
pytestmark = pytest.mark.slow(seconds=220)

SIZE = (192, 96)
PICTURES = re.compile(r"its worst pairs, pictured(?: \([^)]*\))?: (\S+)")


@pytest.fixture(scope="module")
def stack() -> Iterator[OfflineStack]:
    # A first model that sees people well enough to be allowed to judge them (`Rule.competence`).
    with trust_stack(SIZE, 30, **{"class-weighting": "balanced"}) as offline:
        yield offline


def test_erased_people_hold_the_batch_its_swapped_pairs_top_the_relabel_list_and_good_drops_train(
    stack: OfflineStack, tmp_path: Path
) -> None:
    inbox = stack.topic_inbox()
    assert stack.slack is not None

    # Team munich: the first model. Nothing is accepted yet, so nothing judges this drop.
    drop(stack, tmp_path, "munich-01", [{"count": 96, "seed": 1}], size=SIZE)
    first = summary_of(stack, next_run(stack)["name"])
    assert first.outcome == "accepted"
    assert first.screening is not None and not first.screening.screened
    assert first.newly_trusted == [], "being first earns no trust"
    later_runs(stack, 2, **{"class-weighting": "balanced"})

    # Team berlin: nobody labelled people, and 8 masks carry the wrong class map.
    swapped = drop(
        stack,
        tmp_path,
        "berlin-01",
        [
            {"count": 8, "seed": 2, "class_map": SWAP, "unlabelled": ("person",)},
            {"count": 24, "seed": 3, "unlabelled": ("person",)},
        ],
        size=SIZE,
    )[:8]
    second_run = next_run(stack)["name"]
    second = summary_of(stack, second_run)
    assert second.screening is not None and second.screening.screened
    assert list(second.held) == ["berlin-01"], second.screening
    why = " ".join(second.held["berlin-01"])
    assert re.search(r"labelled \w+ where the model sees person: \d+ % of the person pixels the model sees", why), why
    evaluation = MetricsFile.model_validate_json(read(stack, f"reports/runs/{second_run}/metrics.json")).evaluation
    assert evaluation is not None and evaluation.trained_batches == ["munich-01"], "a held batch is not trained on"

    # Its pairs to fix, worst first: the swapped ones on top, pictured (blurred: the stack's default).
    screening = json.loads(read(stack, f"reports/runs/{second_run}/screening.json"))
    assert screening["pictures"] == "blur" and second.screening.pictures == "blur"
    listed = [Path(pair["image"]).name for pair in screening["batches"]["berlin-01"]["pairs"]]
    assert set(listed[:8]) == set(swapped), listed[:10]
    pictured = [Path(p["image"]).name for p in screening["batches"]["berlin-01"]["pairs"] if "picture" in p]
    assert pictured and set(pictured) <= set(swapped), pictured
    report = read(stack, "reports/batches/berlin-01/report.md").decode()
    assert "## Pairs to fix, worst first" in report and "](fix/1.png)" in report, report
    assert read(stack, "reports/batches/berlin-01/fix/1.png").startswith(b"\x89PNG")
    assert "The pictures are blurred so that no face or number plate can be read" in report
    first_listed = report.split("## Pairs to fix, worst first", 1)[1]
    assert any(name.removesuffix(".jpg") in first_listed.splitlines()[2] for name in swapped), first_listed[:400]

    # The team is told, with the pictures a link away and what it takes to let the batch in.
    email = inbox.receive(wait_seconds=1)[-1]
    assert "berlin-01: HELD" in email["Message"] and "person" in email["Message"]
    assert "retrain data release berlin-01 --reason" in email["Message"]
    posted = stack.slack.messages[-1]
    (link,) = PICTURES.findall(json.dumps(posted["blocks"]).replace("\\n", "\n"))
    page = fetch(link)
    assert "<h2 id='new-data'>New data</h2>" in page and page.count("src='data:image/png;base64,") >= 3

    # Team zurich: good labels. They agree with the model, so its verdicts stand and zurich's pairs
    # earn trust; the run is accepted by a gate that never scored a held pair.
    drop(stack, tmp_path, "zurich-01", [{"count": 32, "seed": 4}], size=SIZE)
    third_run = next_run(stack)["name"]
    third = summary_of(stack, third_run)
    assert third.held == {} and third.disputed == {}, third.screening
    assert third.outcome == "accepted", third.gate
    entries = parse_manifest(read(stack, f"dataset/manifests/{third_run}.jsonl").decode())
    assert {entry.batch for entry in entries} == {"munich-01", "zurich-01"}, "held pairs are in no version"
    assert third.gate is not None and third.gate.compared_on is not None
    metrics = MetricsFile.model_validate_json(read(stack, f"reports/runs/{third_run}/metrics.json"))
    assert metrics.evaluation is not None and "berlin-01" not in metrics.evaluation.batches
    assert metrics.val_images == sum(entry.split == "val" for entry in entries)
    assert "zurich-01" in third.newly_trusted and third.trusted_pairs["zurich-01"] > 0, third.trusted_pairs
    assert screening_of(stack, third_run)["corroborated_by"] == ["zurich-01"]

    code, found = audit(stack)
    assert code == 0, found
