"""Three teams' drops in turn on the offline stack, and the one with wrong labels is held (issue 26).

Team A's good drop trains the first accepted model (nothing to screen with yet). Team B exports its
masks with the wrong class map (road <-> sky, building <-> vegetation in every mask; valid files):
the run that screens it holds it with the swap named, trains without it and tells the team, with a
link to the pictures of its worst pairs. Team C's good drop of night scenes (streets the model has
never seen in the dark) is not held, and its run is accepted by a gate that judged on trusted pairs
alone (A's). An engineer releases B: the next version includes it as released, its screening is
still reported, and it is not held again.

Everything runs for real: the intake, the trigger, the state machine on moto's engine, the trainer
under torchrun (screening, training, evaluation) and the evaluation's holds. The gate's tolerances
are loose (template parameters): a model of a quarter width trained for seconds moves by a few
points from run to run, and this test is about which pairs are judged, not by how much.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.common.contracts import MetricsFile
from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.synth import write_scenes
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import audit, drain, executions, upload, wait_until
from tests.integration.test_data_operations import cli, trigger
from trainer.screening.rule import HoldRule

# Four trainings (one of ten epochs), screening and evaluation: 106 s on 2 cores, quiet.
pytestmark = pytest.mark.slow(seconds=110)

RUN_TIMEOUT = 400
SIZE = (128, 64)
SWAP = {"road": "sky", "sky": "road", "building": "vegetation", "vegetation": "building"}
# A first model good enough to screen with: the settings of tests/trainer/test_screening_run.py.
FIRST_RUN = {"workers": 0, "lr": 0.05, "log-every": 0, "checkpoint-every-seconds": 0}
LATER_RUNS = {**FIRST_RUN, "epochs": 2}
PARAMETERS = {
    **DATA,
    **TRAINING,
    "TrainingEpochs": "10",
    "TrainingBatchSize": "8",
    "TrainingCrop": f"{SIZE[0]}x{SIZE[1]}",
    "TrainingExtraHyperparameters": json.dumps(FIRST_RUN),
    "GateMiouTolerance": "0.1",
    "GateClassTolerance": "0.3",
}
HOLD_MARGIN = HoldRule().margin
PICTURES = re.compile(r"its worst pairs, pictured: (\S+)")


@pytest.fixture(scope="module")
def stack() -> Iterator[OfflineStack]:
    """On a loopback server, as `retrain local up` runs it: the links in messages are real URLs."""
    options = StackOptions(mode="server", parameters=PARAMETERS, poll=False, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as offline:
        yield offline


def drop(stack: OfflineStack, folder: Path, batch: str, *, seed: int, count: int, **style: Any) -> None:
    """A team's drop as its annotation tool exports it: every pair, then the batch's marker."""
    for image, label in write_scenes(folder / batch, count=count, size=SIZE, seed=seed, batch=batch, **style):
        upload(stack, f"incoming/{batch}/images/{image.name}", image.read_bytes())
        upload(stack, f"incoming/{batch}/labels/{label.name}", label.read_bytes())
    upload(stack, f"incoming/{batch}/_COMPLETE", b"")


def next_run(stack: OfflineStack, *, start: bool = False) -> dict[str, Any]:
    """Deliver what was dropped (or ask the trigger, as its schedule would), wait for the new run
    to end; its DescribeExecution."""
    before = len(executions(stack))
    drain(stack)
    if start:
        assert trigger(stack)["started"], "the trigger starts a run"
    wait_until(lambda: len(executions(stack)) == before + 1, timeout=60, message="a run to start")
    newest = max(executions(stack), key=lambda e: e["startDate"])
    ended = stack.wait_for_execution(newest["executionArn"], timeout=RUN_TIMEOUT)
    assert ended["status"] == "SUCCEEDED", ended
    return ended


def summary_of(stack: OfflineStack, run: str) -> RunSummary:
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=f"reports/runs/{run}/summary.json")["Body"]
    return RunSummary.model_validate_json(body.read())


def manifest_trusts(stack: OfflineStack, run: str) -> dict[str, str]:
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=f"dataset/manifests/{run}.jsonl")["Body"]
    return {entry["batch"]: entry["trust"] for entry in map(json.loads, body.read().decode().splitlines())}


def metrics_of(stack: OfflineStack, run: str) -> MetricsFile:
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=f"reports/runs/{run}/metrics.json")["Body"]
    return MetricsFile.model_validate_json(body.read())


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_a_drop_with_swapped_classes_is_held_the_others_train_and_a_release_lets_it_back_in(
    stack: OfflineStack, tmp_path: Path
) -> None:
    inbox = stack.topic_inbox()
    assert stack.slack is not None

    # Team A: the first model. Nothing is accepted yet, so nothing screens this drop.
    drop(stack, tmp_path, "team-a", seed=1, count=96)
    first = summary_of(stack, next_run(stack)["name"])
    assert first.outcome == "accepted"
    assert first.screening is not None and not first.screening.screened
    assert "no accepted model" in str(first.screening.why)
    stack.update_function_environment("TrainingJobFunction", TRAINING_EXTRA_HYPERPARAMETERS=json.dumps(LATER_RUNS))

    # Team B: valid files, wrong class map. Screened with A's model, held; the run goes on.
    drop(stack, tmp_path, "team-b", seed=2, count=32, class_map=SWAP)
    second_run = next_run(stack)
    second = summary_of(stack, second_run["name"])
    assert manifest_trusts(stack, second_run["name"]) == {"team-a": "trusted", "team-b": "new"}
    assert second.screening is not None and second.screening.screened
    assert list(second.held) == ["team-b"], second.screening
    named = " ".join(second.held["team-b"])
    assert any(f"labelled {labelled} where the model sees {seen}" in named for labelled, seen in SWAP.items()), named
    assert second.batch_scores["team-b"].held and second.batch_scores["team-b"].candidate is None
    evaluation = metrics_of(stack, second_run["name"]).evaluation
    assert evaluation is not None and evaluation.trained_batches == ["team-a"], "a held batch is not trained on"

    # The team is told: the message names the batch, links to its pictures and names the release.
    emails = inbox.receive(wait_seconds=1)
    email = emails[-1]
    assert "1 batch held" in email["Subject"] and "team-b: HELD" in email["Message"]
    assert "`retrain data release team-b`" in email["Message"]
    posted = stack.slack.messages[-1]
    assert posted["text"] == email["Subject"]
    (link,) = PICTURES.findall(json.dumps(posted["blocks"]).replace("\\n", "\n"))
    assert link in email["Message"] and link.endswith("#new-data")
    page = fetch(link)
    assert "<h2 id='new-data'>New data</h2>" in page and "retrain data release team-b" in page
    assert page.count("src='data:image/png;base64,") >= 3, "the held batch's worst pairs, pictured"

    listed = cli(stack, "held", "--json")
    assert listed.exit_code == 0, listed.output
    (held,) = json.loads(listed.stdout)["held"]
    assert (held["batch"], held["run"]) == ("team-b", second_run["name"])

    # Team C: good labels of scenes the model has never seen (night). Not held; trained on; the
    # gate judges on trusted pairs only, and B (held) is in no later version.
    drop(stack, tmp_path, "team-c-night", seed=3, count=32, light="night")
    third_run = next_run(stack)
    third = summary_of(stack, third_run["name"])
    assert manifest_trusts(stack, third_run["name"]) == {"team-a": "trusted", "team-c-night": "new"}
    assert third.held == {}, third.screening
    assert third.outcome == "accepted", third.gate
    evaluation = metrics_of(stack, third_run["name"]).evaluation
    assert evaluation is not None
    trusted = evaluation.trusted
    assert trusted.batches == ["team-a"] and trusted.pairs == third.batch_scores["team-a"].val_pairs > 0
    assert third.gate is not None and f"{trusted.pairs} trusted validation pairs" in str(third.gate.compared_on)
    assert "team-c-night" in third.newly_trusted

    code, report = audit(stack)
    assert code == 0, report

    # An engineer looks at the pictures, decides B's labels are right after all, and releases it.
    released = cli(stack, "release", "team-b", "--reason", "checked by hand: the export is right")
    assert released.exit_code == 0, released.output
    fourth_run = next_run(stack, start=True)
    fourth = summary_of(stack, fourth_run["name"])
    assert manifest_trusts(stack, fourth_run["name"]) == {
        "team-a": "trusted",
        "team-b": "released",
        "team-c-night": "trusted",
    }
    assert fourth.held == {}, "the operator's decision stands"
    evaluation = metrics_of(stack, fourth_run["name"]).evaluation
    assert evaluation is not None and "team-b" in evaluation.trained_batches
    assert fourth.screening is not None and fourth.screening.screened
    screened = (fourth.screening.model_extra or {})["batches"]
    assert screened["team-b"]["trust"] == "released" and not screened["team-b"]["held"], "its screening is reported"
    # ... and the accepted model (never trained on it) still contradicts it: only the release keeps it in.
    assert screened["team-b"]["excess"] >= HOLD_MARGIN, screened["team-b"]
    assert fourth.batch_scores["team-b"].trust == "released"

    code, report = audit(stack)
    assert code == 0, report
