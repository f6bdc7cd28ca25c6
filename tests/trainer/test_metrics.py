"""mIoU is computed from a confusion matrix, over the classes that are actually there."""

from __future__ import annotations

import math

import pytest
import torch

from functions.common.contracts import scrape_metrics
from trainer.metrics import IGNORE_INDEX, ConfusionMatrix, metric_line


def _confusion(labels: list[int], predictions: list[int], num_classes: int = 4) -> ConfusionMatrix:
    confusion = ConfusionMatrix(num_classes)
    confusion.update(torch.tensor(labels), torch.tensor(predictions))
    return confusion


def test_a_perfect_prediction_scores_one_on_every_present_class() -> None:
    confusion = _confusion([0, 0, 1, 2], [0, 0, 1, 2])
    assert confusion.iou() == [1.0, 1.0, 1.0, None]
    assert confusion.miou() == 1.0


def test_a_class_absent_from_labels_and_predictions_does_not_count_as_zero() -> None:
    # Class 3 never occurs: averaging it in as 0 would cap this perfect result at 0.75.
    confusion = _confusion([0, 1, 2], [0, 1, 2])
    assert confusion.iou()[3] is None, "an absent class must have no IoU, not 0"
    assert confusion.miou() == 1.0


def test_a_class_predicted_but_absent_from_labels_counts_as_zero() -> None:
    confusion = _confusion([0, 0, 1, 1], [0, 3, 1, 1])
    iou = confusion.iou()
    assert iou[3] == 0.0, "a false alarm of an absent class is an IoU of 0"
    assert iou[0] == pytest.approx(0.5) and iou[1] == pytest.approx(1.0)
    assert confusion.miou() == pytest.approx((0.5 + 1.0 + 0.0) / 3)


def test_ignored_pixels_count_for_nothing() -> None:
    confusion = _confusion([0, IGNORE_INDEX, IGNORE_INDEX], [0, 1, 2])
    assert int(confusion.matrix.sum()) == 1
    assert confusion.miou() == 1.0


def test_matrices_of_shards_add_up_to_the_matrix_of_the_whole() -> None:
    labels = torch.randint(0, 4, (1000,))
    predictions = torch.randint(0, 4, (1000,))
    whole = ConfusionMatrix(4)
    whole.update(labels, predictions)
    first, second = ConfusionMatrix(4), ConfusionMatrix(4)
    first.update(labels[:333], predictions[:333])
    second.update(labels[333:], predictions[333:])
    assert torch.equal(first.matrix + second.matrix, whole.matrix)


def test_metric_lines_are_what_the_sagemaker_regexes_read() -> None:
    line = metric_line(epoch=3, train_loss=0.41234, val_miou=0.55123, stall_fraction=0.031)
    assert line.startswith("METRIC epoch=3 ")
    scraped = scrape_metrics(line)
    assert scraped["train:loss"] == [pytest.approx(0.41234)]
    assert scraped["validation:miou"] == [pytest.approx(0.55123)]
    assert scraped["epoch"] == [3.0]


def test_a_diverged_loss_is_still_one_parseable_token() -> None:
    line = metric_line(epoch=1, train_loss=float("nan"), val_miou=0.0)
    assert "train_loss=nan val_miou=0" in line
    assert math.isnan(scrape_metrics(line)["train:loss"][0])
