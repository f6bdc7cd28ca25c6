"""Confusion-matrix IoU and the two forms results leave the job in: METRIC lines and metrics.json.

mIoU is the mean over the classes *present*: those that occur in the validation labels or in the
predictions. A class absent from both has no IoU (reported as null), not an IoU of 0, so a dataset
that simply has no trains in it does not cap mIoU at 18/19; a class predicted but absent from the
labels has IoU 0 and does count. The line format and the JSON shape are a contract: they are
modelled in `functions/common/contracts.py` and tested against real trainer output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

IGNORE_INDEX = 255


class ConfusionMatrix:
    """Counts (label, prediction) pairs; rows are labels, columns predictions."""

    def __init__(self, num_classes: int, device: torch.device | None = None) -> None:
        self.num_classes = num_classes
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    def update(self, labels: torch.Tensor, predictions: torch.Tensor) -> None:
        keep = labels != IGNORE_INDEX
        # Labels outside the taxonomy are treated as ignore rather than corrupting the count.
        keep &= labels < self.num_classes
        flat = labels[keep].long() * self.num_classes + predictions[keep].long()
        self.matrix += torch.bincount(flat, minlength=self.num_classes**2).view(
            self.num_classes, self.num_classes
        )

    def iou(self) -> list[float | None]:
        """Per-class IoU; None where the class is in neither labels nor predictions."""
        matrix = self.matrix.double().cpu()
        true_positive = matrix.diag()
        union = matrix.sum(0) + matrix.sum(1) - true_positive
        return [
            None if union[c] == 0 else float(true_positive[c] / union[c])
            for c in range(self.num_classes)
        ]

    def miou(self) -> float:
        """Mean IoU over the classes present (see the module docstring); 0.0 if none is."""
        present = [value for value in self.iou() if value is not None]
        return sum(present) / len(present) if present else 0.0

    def pixel_accuracy(self) -> float:
        total = int(self.matrix.sum())
        return float(self.matrix.diag().sum()) / total if total else 0.0


def per_class(classes: Sequence[str], iou: Sequence[float | None]) -> dict[str, float | None]:
    return {
        name: (None if v is None else round(v, 6)) for name, v in zip(classes, iou, strict=True)
    }


def metric_line(**values: float | int) -> str:
    """`METRIC name=value ...`: one line, fixed spelling, parsed by SageMaker MetricDefinitions."""
    parts = []
    for name, value in values.items():
        if isinstance(value, int):
            parts.append(f"{name}={value}")
        elif math.isfinite(value):
            parts.append(f"{name}={value:.6g}")
        else:
            # A diverged loss must still be one parseable token.
            parts.append(
                f"{name}={'nan' if math.isnan(value) else ('-inf' if value < 0 else 'inf')}"
            )
    return "METRIC " + " ".join(parts)


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Readers (and SageMaker's upload) never see half a file: write beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    partial.replace(path)
