"""A first drop exported with the wrong class map, then two correct drops of other teams (issue 34).

Nothing judges the first drop (no model yet), so the first model learns its swapped classes
(road <-> sky, building <-> vegetation) and is accepted as a model, but earns its drop no trust:
being first is not a judgement. Team berlin's correct drop then contradicts that model wholesale.
The model learned from labels nobody checked, so its word alone holds nothing: the drop is
*disputed*, trained on, not trusted, the run is not accepted (it learned both sides), and the
message tells the operator what to decide. Team zurich's correct drop contradicts the model the
same way: two other teams against one, with none agreeing, outvote the first drop, which is held
and named; the run trains on the correct drops and is accepted.

All of it on the offline stack: intake, trigger, the state machine on moto's engine, the trainer
under torchrun, the evaluation's trust records and messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.common.contracts import MetricsFile
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import audit
from tests.integration.test_data_operations import cli
from tests.integration.trust_drops import SWAP, drop, later_runs, next_run, read, screening_of, summary_of, trust_stack

# Three trainings (the first of ten epochs), screening and evaluation: about 100 s on 2 cores.
pytestmark = pytest.mark.slow(seconds=100)

SIZE = (128, 64)


@pytest.fixture(scope="module")
def stack() -> Iterator[OfflineStack]:
    with trust_stack(SIZE, 10) as offline:
        yield offline


def test_a_swapped_first_drop_never_becomes_the_trusted_set_and_two_correct_teams_outvote_it(
    stack: OfflineStack, tmp_path: Path
) -> None:
    inbox = stack.topic_inbox()

    # Team munich's first drop, exported with the wrong class map: the first model learns it.
    drop(stack, tmp_path, "munich-01", [{"count": 96, "seed": 1, "class_map": SWAP}], size=SIZE)
    first = summary_of(stack, next_run(stack)["name"])
    assert first.outcome == "accepted" and first.newly_trusted == [], "being first earns no trust"
    later_runs(stack, 3)

    # Team berlin's correct drop: the provisional model contradicts it wholesale. Disputed, not held.
    drop(stack, tmp_path, "berlin-01", [{"count": 32, "seed": 2}], size=SIZE)
    second_run = next_run(stack)["name"]
    second = summary_of(stack, second_run)
    assert second.held == {} and list(second.disputed) == ["berlin-01"], second.screening
    assert second.outcome == "rejected" and second.gate is not None
    assert "dispute" in second.gate.reasons[0], second.gate.reasons
    assert second.newly_trusted == [], "nothing is trusted on a disputed model's word"
    trained = MetricsFile.model_validate_json(read(stack, f"reports/runs/{second_run}/metrics.json")).evaluation
    assert trained is not None and "berlin-01" in trained.trained_batches, "the correct drop is trained on"
    email = inbox.receive(wait_seconds=1)[-1]["Message"]
    assert "berlin-01: DISPUTED" in email, email
    assert "retrain data benchmark" in email and "--checked-by-hand" in email, "the operator is told what to decide"
    assert "retrain data hold" in email

    # Team zurich's correct drop: a second team against the first drop, and none for it.
    drop(stack, tmp_path, "zurich-01", [{"count": 32, "seed": 3}], size=SIZE)
    third_run = next_run(stack)["name"]
    third = summary_of(stack, third_run)
    assert list(third.held) == ["munich-01"], third.screening
    assert "outvoted" in third.held["munich-01"][0] and "berlin" in third.held["munich-01"][0]
    assert screening_of(stack, third_run)["outvoted"] == ["munich-01"]
    assert third.outcome == "accepted", third.gate
    metrics = MetricsFile.model_validate_json(read(stack, f"reports/runs/{third_run}/metrics.json"))
    assert metrics.evaluation is not None and metrics.evaluation.trained_batches == ["berlin-01", "zurich-01"]
    email = inbox.receive(wait_seconds=1)[-1]["Message"]
    assert "munich-01: HELD" in email and "retrain data release munich-01 --reason" in email, email

    listed = cli(stack, "held", "--json")
    assert listed.exit_code == 0, listed.output
    held = {entry["batch"] for entry in json.loads(listed.stdout)["held"]}
    assert held == {"munich-01"}, listed.stdout

    code, found = audit(stack)
    assert code == 0, found
