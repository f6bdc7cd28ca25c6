"""The screening rule on small fixtures: which pairs, classes and batches the accepted model contradicts.

A fixture "model" that knows five-class street scenes (sky, building, sidewalk, road, and small
people standing on the sidewalk): it is sure of the true class inside each region (with a little
noise) and hesitant on the boundaries, and on scenes of an unseen style its probabilities spread
out. Batches: clean, two classes swapped in every mask, a quarter of the pairs swapped,
boundaries a few pixels off, people left unlabelled (painted as the sidewalk behind them), one
class ignored, and the unseen style. Then the decisions (`verdicts.py`): who may hold what, with
independent and provisional calibrations. The rule's pixel count and pair ranking agree with
cleanlab's on a fixture with label errors, and its label-quality score is cleanlab's softmin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cleanlab.segmentation.filter import find_label_issues
from cleanlab.segmentation.rank import get_label_quality_scores

from functions.common.contracts import pair_digest
from functions.common.taxonomy import CITYSCAPES_COLORS
from trainer.data import Entry
from trainer.screening.phase import pair_key
from trainer.screening.pictures import CITYSCAPES_COLORS as TRAINER_COLORS
from trainer.screening.rule import (
    BatchJudgement,
    Calibration,
    CalibrationBuilder,
    ClassFinding,
    PairCounts,
    Rule,
    calibrate,
    count_pair,
    judge_batch,
)
from trainer.screening.verdicts import (
    DISPUTED,
    HELD,
    INDEPENDENT,
    LEFT_OUT,
    NOT_JUDGED,
    OK,
    OUTVOTED,
    PROVISIONAL,
    BatchCase,
    decide,
)

CLASSES = ["road", "sidewalk", "building", "sky", "person"]
ROAD, SIDEWALK, BUILDING, SKY, PERSON = range(5)
H, W = 96, 128
RULE = Rule(min_class_pixels=40)


def _scene(rng: np.random.Generator) -> np.ndarray:
    """Sky on top, buildings, a sidewalk with two people, the road at the bottom; lines move a little."""
    truth = np.empty((H, W), dtype=np.int64)
    sky_end, building_end, sidewalk_end = 24 + rng.integers(0, 9), 52 + rng.integers(0, 9), 66 + rng.integers(0, 6)
    truth[:sky_end], truth[sky_end:building_end] = SKY, BUILDING
    truth[building_end:sidewalk_end], truth[sidewalk_end:] = SIDEWALK, ROAD
    for left in (20 + rng.integers(0, 10), 90 + rng.integers(0, 10)):
        truth[building_end - 8 : sidewalk_end, left : left + 4] = PERSON  # about 2 % of the image
    return truth


def _probs(truth: np.ndarray, rng: np.random.Generator, *, sure: float) -> torch.Tensor:
    """What the model says: `sure` on the true class (less on the boundaries), noise on top."""
    logits = rng.normal(0.0, 0.3, (len(CLASSES), H, W))
    boundary = np.zeros((H, W), dtype=bool)
    boundary[1:] |= truth[1:] != truth[:-1]
    boundary[:-1] |= truth[:-1] != truth[1:]
    boundary[:, 1:] |= truth[:, 1:] != truth[:, :-1]
    lift = np.where(boundary, np.log(sure / (1 - sure)) * 0.3, np.log(sure / (1 - sure)) + np.log(3))
    np.put_along_axis(logits, truth[None], np.take_along_axis(logits, truth[None], 0) + lift, 0)
    return torch.from_numpy(logits).softmax(dim=0)


def _pairs(kind: str, seed: int, count: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for index in range(count):
        truth = _scene(rng)
        probs = _probs(truth, rng, sure=0.35 if kind == "unseen style" else 0.93)
        labels = truth.copy()
        if kind == "swapped" or (kind == "quarter swapped" and index < count // 4):
            # Exported with the wrong class map: sky <-> road and building <-> sidewalk.
            labels = np.choose(truth, [SKY, BUILDING, SIDEWALK, ROAD, PERSON])
        elif kind == "sloppy":
            labels = np.vstack([truth[:2], truth[:-2]])  # every boundary two pixels low (of 96 rows)
        elif kind == "people erased":
            labels[labels == PERSON] = SIDEWALK  # painted as what is behind them
        elif kind == "one class ignored":
            labels[labels == SIDEWALK] = 255
        pairs.append((probs, torch.from_numpy(labels)))
    return pairs


def _calibration(rule: Rule = RULE) -> Calibration:
    builder = CalibrationBuilder(len(CLASSES))
    for probs, labels in _pairs("clean", seed=0, count=12):
        builder.update(probs, labels)
    return calibrate(builder, rule, builder.pair_counts(rule))


KINDS = ["clean", "swapped", "quarter swapped", "sloppy", "people erased", "one class ignored", "unseen style"]


Judged = tuple[Calibration, dict[str, list[PairCounts]], dict[str, BatchJudgement]]


@pytest.fixture(scope="module")
def judged() -> Judged:
    calibration = _calibration()
    counts = {
        kind: [count_pair(p, lab, calibration.thresholds, calibration.judged) for p, lab in _pairs(kind, seed=i + 1)]
        for i, kind in enumerate(KINDS)
    }
    return calibration, counts, {kind: judge_batch(c, calibration, RULE, CLASSES) for kind, c in counts.items()}


def _finding(judgement: BatchJudgement) -> str:
    case = BatchCase("b", "team", judgement)
    return decide([case], INDEPENDENT, frozenset(), [], RULE).batches["b"].verdict


def test_clean_and_sloppy_batches_pass_and_the_swapped_one_is_held(judged: Judged) -> None:
    _, _, judgements = judged
    verdicts = {kind: _finding(j) for kind, j in judgements.items()}
    assert verdicts["clean"] == OK and verdicts["sloppy"] == OK, verdicts
    assert verdicts["swapped"] == HELD, verdicts
    assert verdicts["one class ignored"] == OK, "an ignored class is not an error"
    assert judgements["swapped"].contradicted == list(range(8)), "every swapped pair is contradicted"


def test_a_quarter_of_swapped_pairs_is_left_out_and_the_rest_trains(judged: Judged) -> None:
    _, _, judgements = judged
    quarter = judgements["quarter swapped"]
    assert quarter.contradicted == [0, 1], quarter.contradicted
    decision = decide([BatchCase("b", "team", quarter)], INDEPENDENT, frozenset(), [], RULE).batches["b"]
    assert decision.verdict == LEFT_OUT and decision.left_out == [0, 1] and not decision.held


def test_people_left_unlabelled_are_found_though_they_are_two_percent_of_the_pixels(judged: Judged) -> None:
    calibration, counts, judgements = judged
    erased = judgements["people erased"]
    people = sum(int(c.seen[PERSON]) for c in counts["people erased"]) / sum(c.pixels for c in counts["people erased"])
    assert people < 0.03, people
    (finding,) = erased.findings
    assert (finding.kind, finding.labelled, finding.seen) == ("erased", "sidewalk", "person"), finding
    assert finding.text.startswith("labelled sidewalk where the model sees person: "), finding.text
    assert "of the person pixels the model sees" in finding.text
    assert _finding(erased) == HELD
    # No single pair is contradicted by much: a batch-wide share would never have seen it.
    assert all(c.excess(calibration.usual) < 0.05 for c in counts["people erased"])


def test_the_swap_is_named_class_by_class(judged: Judged) -> None:
    _, _, judgements = judged
    named = {(f.labelled, f.seen) for f in judgements["swapped"].findings}
    assert named == {("sky", "road"), ("road", "sky"), ("building", "sidewalk"), ("sidewalk", "building")}
    assert all(f.kind == "relabelled" for f in judgements["swapped"].findings)


def test_scenes_the_model_is_unsure_of_are_not_judged(judged: Judged) -> None:
    calibration, counts, judgements = judged
    assert all(not calibration.pair_is_judged(c, RULE) for c in counts["unseen style"])
    assert _finding(judgements["unseen style"]) == NOT_JUDGED


def test_a_class_the_model_never_learned_is_not_judged() -> None:
    """A model that confuses people with the sidewalk on calibration labels says nothing of people."""
    builder = CalibrationBuilder(len(CLASSES))
    for probs, labels in _pairs("clean", seed=0, count=6):
        blind = probs.clone()
        blind[SIDEWALK] += blind[PERSON]
        blind[PERSON] = 0.0
        builder.update(blind, labels)
    calibration = calibrate(builder, RULE, builder.pair_counts(RULE))
    assert not bool(calibration.judged[PERSON]) and bool(calibration.judged[ROAD])
    counts = [count_pair(p, lab, calibration.thresholds, calibration.judged) for p, lab in _pairs("people erased", 9)]
    assert judge_batch(counts, calibration, RULE, CLASSES).findings == []


def test_a_weak_models_own_confusions_do_not_count_against_a_pair() -> None:
    """What the model gets wrong on calibration labels is its own: only errors beyond that count."""
    # A weak model that sees sidewalk on a third of the road, on calibration labels and new ones alike.
    probs = torch.zeros(len(CLASSES), H, W)
    probs[SIDEWALK, :, : W // 2], probs[ROAD, :, W // 2 :] = 0.9, 0.9
    probs[SKY] = 0.1
    labels = torch.full((H, W), ROAD)
    labels[:, : W // 4] = SIDEWALK
    builder = CalibrationBuilder(len(CLASSES))
    builder.update(probs, labels)
    rule = Rule(min_class_pixels=1)
    calibration = calibrate(builder, rule, builder.pair_counts(rule))
    assert bool(calibration.judged[ROAD]) and bool(calibration.judged[SIDEWALK])
    counts = count_pair(probs, labels, calibration.thresholds, calibration.judged)
    assert int(counts.errors[ROAD, SIDEWALK]) > 0 and counts.excess(calibration.usual) == 0.0


def test_a_pair_with_no_labelled_pixel_is_not_judged() -> None:
    calibration = _calibration()
    counts = count_pair(torch.full((5, H, W), 0.2), torch.full((H, W), 255), calibration.thresholds, calibration.judged)
    assert counts.pixels == 0 and counts.quality == 1.0 and not calibration.pair_is_judged(counts, RULE)


def _case(name: str, team: str, kind: str) -> BatchCase:
    """A batch whose judgement is of one kind, for the decisions alone."""
    erased = ClassFinding("erased", "sidewalk", "person", 0.9, 0.1, 500, 5, "labelled sidewalk where ...")
    relabelled = ClassFinding("relabelled", "sky", "road", 0.95, 0.0, 900, 8, "labelled sky where ...")
    judgement = {
        "agrees": BatchJudgement(pairs=8, judged=8, contradicted=[]),
        "wholesale": BatchJudgement(pairs=8, judged=8, contradicted=list(range(8)), findings=[relabelled]),
        "minority": BatchJudgement(pairs=8, judged=8, contradicted=[3]),
        "erased": BatchJudgement(pairs=8, judged=8, contradicted=[], findings=[erased]),
    }[kind]
    return BatchCase(name, team, judgement)


def test_an_independent_model_holds_a_wholesale_contradiction() -> None:
    found = decide([_case("berlin-02", "berlin", "wholesale")], INDEPENDENT, frozenset({"munich"}), ["munich-01"], RULE)
    assert found.batches["berlin-02"].verdict == HELD and found.disputed == []


def test_a_provisional_models_word_alone_holds_nothing_wholesale() -> None:
    """A swapped first drop must not make the next correct drop held: it is a dispute, for a person."""
    found = decide([_case("berlin-01", "berlin", "wholesale")], PROVISIONAL, frozenset({"munich"}), ["munich-01"], RULE)
    decision = found.batches["berlin-01"]
    assert decision.verdict == DISPUTED and not decision.held and not decision.independent
    assert found.disputed == ["berlin-01"] and "retrain data benchmark" in decision.reasons[0]


def test_another_team_that_agrees_corroborates_the_provisional_model() -> None:
    cases = [_case("berlin-01", "berlin", "wholesale"), _case("zurich-01", "zurich", "agrees")]
    found = decide(cases, PROVISIONAL, frozenset({"munich"}), ["munich-01"], RULE)
    assert found.corroborated_by == ["zurich-01"]
    assert found.batches["berlin-01"].verdict == HELD, "two teams agree: the third is wrong"
    assert found.batches["zurich-01"].independent, "its passing pairs earn trust"


def test_two_other_teams_that_contradict_it_outvote_the_provisional_models_own_batches() -> None:
    cases = [
        _case("munich-01", "munich", "agrees"),  # its validation pairs agree with the model trained on it
        _case("berlin-01", "berlin", "wholesale"),
        _case("zurich-01", "zurich", "wholesale"),
    ]
    found = decide(cases, PROVISIONAL, frozenset({"munich"}), ["munich-01"], RULE)
    assert found.outvoted == ["munich-01"] and found.batches["munich-01"].verdict == OUTVOTED
    assert found.batches["munich-01"].held
    for name in ("berlin-01", "zurich-01"):
        decision = found.batches[name]
        assert decision.verdict == OK and not decision.held and not decision.independent, (name, decision)


def test_whatever_the_calibration_a_minority_is_left_out_and_an_erased_class_holds() -> None:
    for calibration in (INDEPENDENT, PROVISIONAL):
        found = decide(
            [_case("berlin-01", "berlin", "minority"), _case("zurich-01", "zurich", "erased")],
            calibration,
            frozenset({"munich"}),
            ["munich-01"],
            RULE,
        )
        assert found.batches["berlin-01"].left_out == [3], calibration
        assert found.batches["zurich-01"].verdict == HELD, calibration


def test_a_released_batch_is_never_held_again() -> None:
    case = _case("berlin-01", "berlin", "wholesale")
    released = BatchCase(case.name, case.team, case.judgement, frozenset(range(8)))
    decision = decide([released], INDEPENDENT, frozenset(), [], RULE).batches["berlin-01"]
    assert decision.verdict == OK and not decision.held and "released by a person" in decision.reasons[-1]


def test_the_label_quality_score_is_cleanlabs_softmin() -> None:
    rng = np.random.default_rng(3)
    pairs = _pairs("quarter swapped", seed=5, count=4)
    labels = np.stack([lab.numpy() for _, lab in pairs])
    probs = np.stack([p.numpy() for p, _ in pairs]).astype(np.float32)
    theirs, _ = get_label_quality_scores(labels, probs, method="softmin", verbose=False)
    calibration = _calibration()
    ours = [count_pair(p, lab, calibration.thresholds, calibration.judged).quality for p, lab in pairs]
    assert ours == pytest.approx(list(theirs), rel=1e-4), (ours, theirs)
    assert rng is not None and np.argmin(ours) in {0}, "a swapped pair has the lowest quality"


def test_the_rule_agrees_with_cleanlab_on_which_pairs_and_how_many_pixels() -> None:
    rng = np.random.default_rng(0)
    count, classes, h, w = 12, 5, 32, 48
    truth = np.zeros((count, h, w), dtype=np.int64)
    for n in range(count):
        for k in range(classes):
            top, left = rng.integers(0, h - 8), rng.integers(0, w - 8)
            truth[n, top : top + rng.integers(6, 16), left : left + rng.integers(6, 20)] = k
    logits = rng.normal(0.0, 1.0, (count, classes, h, w))
    lift = rng.uniform(1.5, 4.5, (count, 1, h, w))
    np.put_along_axis(logits, truth[:, None], np.take_along_axis(logits, truth[:, None], 1) + lift, 1)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = truth.copy()
    for n in (3, 7):  # two pairs with classes 1 and 2 swapped
        labels[n] = np.choose(truth[n], [0, 2, 1, 3, 4])
    noise = rng.random(labels.shape) < 0.02
    labels[noise] = rng.integers(0, classes, int(noise.sum()))

    theirs = find_label_issues(labels, probs.astype(np.float32), verbose=False, n_jobs=1)
    # Thresholds from the labels being checked, as cleanlab estimates them; every class judged.
    rule = Rule(competence=0.0)
    builder = CalibrationBuilder(classes)
    for n in range(count):
        builder.update(torch.from_numpy(probs[n]), torch.from_numpy(labels[n]))
    thresholds, judged = builder.thresholds(), builder.judged(rule)
    ours = np.array(
        [
            int(count_pair(torch.from_numpy(probs[n]), torch.from_numpy(labels[n]), thresholds, judged).errors.sum())
            for n in range(count)
        ]
    )
    theirs_per_pair = theirs.sum(axis=(1, 2))
    # cleanlab flags a pixel where any other class reaches its threshold; we where the model's
    # prediction does: a subset, of about the same size. The same pairs stand out (the swapped ones).
    assert 0.6 * theirs.sum() <= ours.sum() <= 1.05 * theirs.sum(), (ours.sum(), theirs.sum())
    assert set(np.argsort(ours)[-2:]) == set(np.argsort(theirs_per_pair)[-2:]) == {3, 7}
    assert np.corrcoef(ours, theirs_per_pair)[0, 1] > 0.95, (ours, theirs_per_pair)


def test_the_trainers_pair_key_is_the_ledgers_pair_digest_and_its_colours_the_taxonomys() -> None:
    entry = Entry(
        image="images/a.jpg", label="labels/a.png", split="train", image_sha256="ab" * 32, label_sha256="cd" * 32
    )
    assert pair_key(entry) == pair_digest("ab" * 32, "cd" * 32)
    assert TRAINER_COLORS == CITYSCAPES_COLORS
