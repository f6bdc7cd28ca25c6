"""Confusion-matrix IoU and the two forms results leave the job in: METRIC lines and metrics.json.

Also the per-epoch bookkeeping those are made of: each rank's running sums (`EpochProgress`),
reduced over the ranks at the end of an epoch into one record of `metrics.json`'s `epochs`.

mIoU is the mean over the classes *present*: those that occur in the validation labels or in the
predictions. A class absent from both has no IoU (reported as null), not an IoU of 0, so a dataset
that simply has no trains in it does not cap mIoU at 18/19; a class predicted but absent from the
labels has IoU 0 and does count. The line format and the JSON shape are a contract: they are
modelled in `functions/common/contracts.py` and tested against real trainer output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import distributed, timing

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
        self.matrix += torch.bincount(flat, minlength=self.num_classes**2).view(self.num_classes, self.num_classes)

    def iou(self) -> list[float | None]:
        """Per-class IoU; None where the class is in neither labels nor predictions."""
        matrix = self.matrix.double().cpu()
        true_positive = matrix.diag()
        union = matrix.sum(0) + matrix.sum(1) - true_positive
        return [None if union[c] == 0 else float(true_positive[c] / union[c]) for c in range(self.num_classes)]

    def miou(self) -> float:
        """Mean IoU over the classes present (see the module docstring); 0.0 if none is."""
        present = [value for value in self.iou() if value is not None]
        return sum(present) / len(present) if present else 0.0

    def pixel_accuracy(self) -> float:
        total = int(self.matrix.sum())
        return float(self.matrix.diag().sum()) / total if total else 0.0


def per_class(classes: Sequence[str], iou: Sequence[float | None]) -> dict[str, float | None]:
    return {name: (None if v is None else round(v, 6)) for name, v in zip(classes, iou, strict=True)}


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
            parts.append(f"{name}={'nan' if math.isnan(value) else ('-inf' if value < 0 else 'inf')}")
    return "METRIC " + " ".join(parts)


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Readers (and SageMaker's upload) never see half a file: write beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    partial.replace(path)


@dataclass
class EpochProgress:
    """One rank's running sums for the current epoch. Saved in mid-epoch checkpoints, so that a
    resumed epoch reports the whole epoch rather than the part after the restart."""

    loss_sum: float = 0.0
    micro_batches: int = 0
    images: int = 0
    wait_seconds: float = 0.0
    train_seconds: float = 0.0
    # Gradient all-reduce not hidden behind backward, and all of it (see trainer/timing.py).
    comm_seconds: float = 0.0
    allreduce_seconds: float = 0.0


def reduce_progress(progress: EpochProgress, device: torch.device, world_size: int) -> dict[str, Any]:
    """The epoch over all ranks (loss, images/s, where step time went), and each rank's split."""
    sums = torch.tensor(
        [progress.loss_sum, progress.micro_batches, progress.images],
        dtype=torch.float64,
        device=device,
    )
    distributed.all_reduce_sum(sums)
    loss, micro_batches, images = sums.tolist()
    # Every rank's own times: a rank starved by its loader shows a high stall while the others
    # show the same time as communication (they wait for it in the all-reduce).
    every_rank = [EpochProgress(**fields) for fields in distributed.gather_objects(asdict(progress))]
    seconds = sum(rank.train_seconds for rank in every_rank)
    wait = sum(rank.wait_seconds for rank in every_rank)
    communication = sum(rank.comm_seconds for rank in every_rank)
    allreduce = sum(rank.allreduce_seconds for rank in every_rank)
    return {
        "loss": loss / max(1.0, micro_batches),
        **timing.fractions(seconds, wait, max(0.0, seconds - wait - communication), communication),
        "allreduce_fraction": min(1.0, allreduce / seconds) if seconds > 0 else 0.0,
        # Ranks step in lock-step, so the mean rank's time is the epoch's training time.
        "images_per_sec": images / (seconds / world_size) if seconds > 0 else 0.0,
        "ranks": [_rank_timing(rank, fields) for rank, fields in enumerate(every_rank)],
    }


def _rank_timing(rank: int, progress: EpochProgress) -> dict[str, Any]:
    step = progress.train_seconds
    compute = max(0.0, step - progress.wait_seconds - progress.comm_seconds)
    return {
        "rank": rank,
        "step_seconds": round(step, 4),
        "data_wait_seconds": round(progress.wait_seconds, 4),
        "compute_seconds": round(compute, 4),
        "communication_seconds": round(progress.comm_seconds, 4),
        "allreduce_seconds": round(progress.allreduce_seconds, 4),
        "stall_fraction": round(min(1.0, progress.wait_seconds / step) if step > 0 else 0.0, 6),
    }


def epoch_record(
    epoch: int,
    totals: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    confusion: ConfusionMatrix,
    *,
    classes: list[str],
    steps: int,
) -> dict[str, Any]:
    """One entry of metrics.json's `epochs`; the caller fills in `epoch_seconds`."""
    return {
        "epoch": epoch + 1,
        "train_loss": round(totals["loss"], 6),
        "lr": optimizer.param_groups[0]["lr"],
        "miou": round(confusion.miou(), 6),
        "per_class_iou": per_class(classes, confusion.iou()),
        "pixel_accuracy": round(confusion.pixel_accuracy(), 6),
        "stall_fraction": round(totals["stall_fraction"], 6),
        "compute_fraction": round(totals["compute_fraction"], 6),
        "communication_fraction": round(totals["communication_fraction"], 6),
        "allreduce_fraction": round(totals["allreduce_fraction"], 6),
        "images_per_sec": round(totals["images_per_sec"], 3),
        "epoch_seconds": 0.0,
        "steps": steps,
        "ranks": totals["ranks"],
    }


def epoch_metric_line(record: dict[str, Any]) -> str:
    """The epoch's `METRIC ...` line, from its record."""
    return metric_line(
        epoch=record["epoch"],
        train_loss=record["train_loss"],
        val_miou=record["miou"],
        stall_fraction=record["stall_fraction"],
        compute_fraction=record["compute_fraction"],
        communication_fraction=record["communication_fraction"],
        images_per_sec=record["images_per_sec"],
        epoch_seconds=record["epoch_seconds"],
        lr=record["lr"],
    )


def read_metrics(folder: Path) -> dict[str, Any] | None:
    path = folder / "metrics.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_metrics(
    folders: Iterable[str],
    lineage_info: dict[str, Any],
    history: Sequence[dict[str, Any]],
    baseline: dict[str, Any] | None,
    *,
    complete: bool,
) -> None:
    """metrics.json, rewritten every epoch, so even an interrupted job leaves its lineage: the
    epochs so far (`history`) and the accepted model's scores on the same split (`baseline`)."""
    last = history[-1] if history else None
    document = {
        "schema_version": 1,
        **lineage_info,
        "epochs": list(history),
        "miou": last["miou"] if last else None,
        "per_class_iou": last["per_class_iou"] if last else {},
        "baseline": baseline,
        "complete": complete,
    }
    for folder in dict.fromkeys(folders):
        write_json_atomically(Path(folder) / "metrics.json", document)
