"""The screening rule on small fixtures: which batches the accepted model confidently contradicts.

A fixture "model" that knows four-class street scenes: it is sure of the true class inside each
region (with a little noise) and hesitant on the boundaries, and on scenes of an unseen style its
probabilities spread out. Batches: clean, two classes swapped in every mask, boundaries a few
pixels off, one class left unlabelled, and the unseen style. Only the swapped one is held, and
its reasons name the swap. The rule also agrees with cleanlab's on a fixture with label errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cleanlab.segmentation.filter import find_label_issues

from trainer.screening.rule import HoldRule, SelfConfidence, Tally, likely_errors

CLASSES = ["road", "sidewalk", "building", "sky"]
ROAD, SIDEWALK, BUILDING, SKY = range(4)
H, W = 96, 128


def _scene(rng: np.random.Generator) -> np.ndarray:
    """Sky on top, buildings, a sidewalk, the road at the bottom; the lines move a little."""
    truth = np.empty((H, W), dtype=np.int64)
    sky_end, building_end, sidewalk_end = 24 + rng.integers(0, 9), 52 + rng.integers(0, 9), 66 + rng.integers(0, 6)
    truth[:sky_end], truth[sky_end:building_end] = SKY, BUILDING
    truth[building_end:sidewalk_end], truth[sidewalk_end:] = SIDEWALK, ROAD
    return truth


def _probs(truth: np.ndarray, rng: np.random.Generator, *, sure: float) -> torch.Tensor:
    """What the model says: `sure` on the true class (less on the boundary rows), noise on top."""
    logits = rng.normal(0.0, 0.3, (4, H, W))
    boundary = np.zeros((H, W), dtype=bool)
    boundary[1:] |= truth[1:] != truth[:-1]
    boundary[:-1] |= truth[:-1] != truth[1:]
    lift = np.where(boundary, np.log(sure / (1 - sure)) * 0.3, np.log(sure / (1 - sure)) + np.log(3))
    np.put_along_axis(logits, truth[None], np.take_along_axis(logits, truth[None], 0) + lift, 0)
    return torch.from_numpy(logits).softmax(dim=0)


def _batch(kind: str, seed: int, count: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        truth = _scene(rng)
        probs = _probs(truth, rng, sure=0.35 if kind == "unseen style" else 0.93)
        labels = truth.copy()
        if kind == "swapped":
            # Exported with the wrong class map: sky <-> road and building <-> sidewalk.
            labels = np.choose(truth, [SKY, BUILDING, SIDEWALK, ROAD])
        elif kind == "sloppy":
            # Every boundary drawn two pixels low (of 96 rows).
            labels = np.vstack([truth[:2], truth[:-2]])
        elif kind == "one class unlabelled":
            labels[labels == SIDEWALK] = 255
        pairs.append((probs, torch.from_numpy(labels)))
    return pairs


def _screen(batches: dict[str, list[tuple[torch.Tensor, torch.Tensor]]]) -> tuple[Tally, dict[str, Tally]]:
    confidence = SelfConfidence(len(CLASSES))
    for probs, labels in batches["trusted"]:
        confidence.update(probs, labels)
    thresholds = confidence.thresholds()
    tallies = {name: Tally(len(CLASSES)) for name in batches}
    for name, pairs in batches.items():
        for probs, labels in pairs:
            tallies[name].add(probs, labels, thresholds)
    return tallies.pop("trusted"), tallies


@pytest.fixture(scope="module")
def screened() -> tuple[Tally, dict[str, Tally]]:
    kinds = ["clean", "swapped", "sloppy", "one class unlabelled", "unseen style"]
    batches = {"trusted": _batch("clean", seed=0), **{kind: _batch(kind, seed=i + 1) for i, kind in enumerate(kinds)}}
    return _screen(batches)


def test_only_the_batch_whose_masks_swap_classes_is_held(screened: tuple[Tally, dict[str, Tally]]) -> None:
    reference, tallies = screened
    rule = HoldRule()
    shares = {name: round(tally.share, 3) for name, tally in tallies.items()}
    excess = {name: round(tally.excess_share(reference), 3) for name, tally in tallies.items()}
    unfamiliar = {name: round(tally.unfamiliarity(reference), 3) for name, tally in tallies.items()}
    held = {name for name, t in tallies.items() if rule.holds(t.excess_share(reference), t.unfamiliarity(reference))}
    assert held == {"swapped"}, f"shares {shares}, excess {excess}, unfamiliarity {unfamiliar}"
    # Most of its pixels: the rest are boundaries, and pixels where the model is less sure than usual.
    assert tallies["swapped"].share > 0.6, shares
    assert excess["sloppy"] < rule.margin / 2, excess
    # Relabelling leaves what the model sees as it was: the swap is judged, not excused.
    assert unfamiliar["swapped"] < rule.unfamiliar / 2, unfamiliar


def test_the_swap_is_named_class_by_class(screened: tuple[Tally, dict[str, Tally]]) -> None:
    reference, tallies = screened
    named = {(c["labelled"], c["seen"]) for c in tallies["swapped"].confusions(CLASSES, reference, top=4)}
    assert named == {("sky", "road"), ("road", "sky"), ("building", "sidewalk"), ("sidewalk", "building")}
    top = tallies["swapped"].confusions(CLASSES, reference, top=1)[0]
    assert top["share_of_labelled"] > 0.6
    assert top["text"].startswith(f"labelled {top['labelled']} where the model sees {top['seen']}: ")
    assert top["text"].endswith("(0 % on trusted pairs)"), top["text"]


def test_new_scenes_the_model_is_unsure_of_are_not_contradicted(screened: tuple[Tally, dict[str, Tally]]) -> None:
    reference, tallies = screened
    # The model is unsure there, not confidently of another class: no more flags than on clean data.
    assert tallies["unseen style"].share <= max(reference.share, 0.02), tallies["unseen style"].share


def test_an_unlabelled_class_is_ignored_not_counted_against_the_batch(screened: tuple[Tally, dict[str, Tally]]) -> None:
    _, tallies = screened
    unlabelled = tallies["one class unlabelled"]
    assert int(unlabelled.labelled[SIDEWALK]) == 0 and unlabelled.pixels < tallies["clean"].pixels


def test_a_batch_with_no_labelled_pixel_has_quality_one_and_share_zero() -> None:
    tally = Tally(len(CLASSES))
    labels = torch.full((H, W), 255)
    probs = torch.full((4, H, W), 0.25)
    assert tally.add(probs, labels, torch.full((4,), 0.5)) == 1.0
    assert tally.share == 0.0 and tally.excess_share(tally) == 0.0


def test_a_class_without_trusted_pixels_is_never_the_one_seen() -> None:
    confidence = SelfConfidence(3)
    confidence.update(torch.tensor([[[0.9]], [[0.05]], [[0.05]]]), torch.tensor([[0]]))
    thresholds = confidence.thresholds()
    assert thresholds[0] == pytest.approx(0.9) and torch.isinf(thresholds[1:]).all()
    flagged, _ = likely_errors(torch.tensor([[[0.01]], [[0.98]], [[0.01]]]), torch.tensor([[0]]), thresholds)
    assert not flagged.any()


def test_a_weak_models_own_confusions_do_not_count_against_a_batch() -> None:
    """The rule follows the model's quality: what it gets wrong on trusted labels is its own."""
    thresholds = torch.full((4,), 0.5)
    # A weak model that sees sidewalk on half the road, on trusted labels and new ones alike.
    probs = torch.zeros(4, H, W)
    probs[SIDEWALK, :, : W // 2], probs[ROAD, :, W // 2 :] = 0.9, 0.9
    probs[SKY] = 0.1 / 3
    labels = torch.full((H, W), ROAD)
    trusted, batch = Tally(4), Tally(4)
    trusted.add(probs, labels, thresholds)
    batch.add(probs, labels, thresholds)
    assert batch.share == pytest.approx(0.5)
    assert batch.excess_share(trusted) == 0.0 and not HoldRule().holds(batch.excess_share(trusted), 0.0)


def test_a_batch_the_model_does_not_know_is_never_held() -> None:
    rule = HoldRule(margin=0.15, unfamiliar=0.2)
    assert rule.holds(0.5, 0.05)
    assert not rule.holds(0.5, 0.4), "the model sees other things there: its disagreement says nothing"
    assert not rule.holds(0.1, 0.0)


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
    # Thresholds from the labels being checked, as cleanlab estimates them.
    confidence = SelfConfidence(classes)
    for n in range(count):
        confidence.update(torch.from_numpy(probs[n]), torch.from_numpy(labels[n]))
    ours = np.stack(
        [
            likely_errors(torch.from_numpy(probs[n]), torch.from_numpy(labels[n]), confidence.thresholds())[0].numpy()
            for n in range(count)
        ]
    )
    # The same number of likely errors (both count the confident joint's off-diagonal)...
    assert abs(int(ours.sum()) - int(theirs.sum())) <= 0.05 * theirs.sum(), (ours.sum(), theirs.sum())
    # ...the same pairs stand out (the swapped ones), and each pair's count is close. Which
    # pixels differ at the margin: cleanlab takes the least self-confident pixels up to that
    # count, we take the pixels where another class reaches its threshold.
    ours_per_pair, theirs_per_pair = ours.sum(axis=(1, 2)), theirs.sum(axis=(1, 2))
    assert set(np.argsort(ours_per_pair)[-2:]) == set(np.argsort(theirs_per_pair)[-2:]) == {3, 7}
    assert np.corrcoef(ours_per_pair, theirs_per_pair)[0, 1] > 0.95, (ours_per_pair, theirs_per_pair)
