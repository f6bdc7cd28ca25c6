"""The candidate against the accepted model, per batch and on the trusted evaluation set.

The quality gate must not compare the two on a split that moves with new data: a mislabelled
batch's validation pairs would make the clean accepted model look bad and a model trained on the
bad labels look good. So every validation pair is scored per batch and trust (one confusion matrix
per group, in one pass over the split), and the *trusted set* is the sum over the pairs whose
labels earned trust (`trusted`: an independent screening passed them) and the `benchmark` pairs.
Pairs screening left out are in no split, so no score ever counts them. `metrics.json`'s
`evaluation` holds both, for the gate and for each drop's impact.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainer import distributed, precision
from trainer.data import Entry, SegmentationDataset, ShardSampler, to_device
from trainer.metrics import IGNORE_INDEX, ConfusionMatrix, per_class

log = logging.getLogger("trainer")

GATE_TRUSTS = frozenset({"trusted", "benchmark"})
# A batch's trusted pairs are scored as a group of their own: "<batch><TRUSTED_GROUP>".
TRUSTED_GROUP = "#trusted"


def group_of(entry: Entry) -> str:
    return f"{entry.batch}{TRUSTED_GROUP}" if entry.trust in GATE_TRUSTS else entry.batch


class _Indexed(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    def __init__(self, dataset: SegmentationDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        image, label = self.dataset[index]
        return image, label, index


@torch.inference_mode()
def confusion_by_batch(
    model: nn.Module,
    dataset: SegmentationDataset,
    num_classes: int,
    device: torch.device,
    *,
    batch_size: int,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
) -> dict[str, torch.Tensor]:
    """One (K, K) confusion matrix per group of `dataset.entries` (`group_of`: a batch's trusted
    pairs apart from its others), summed over every rank's shard (one all-reduce, so every rank
    must call it)."""
    names = sorted({group_of(entry) for entry in dataset.entries})
    position = {name: number for number, name in enumerate(names)}
    group = torch.tensor([position[group_of(entry)] for entry in dataset.entries], device=device)
    k = num_classes
    counts = torch.zeros(len(names) * k * k, dtype=torch.long, device=device)
    rank = torch.distributed.get_rank() if distributed.is_distributed() else 0
    world = torch.distributed.get_world_size() if distributed.is_distributed() else 1
    loader: DataLoader[Any] = DataLoader(
        _Indexed(dataset), batch_size=batch_size, sampler=ShardSampler(len(dataset), world, rank)
    )
    model.eval()
    for raw_images, raw_labels, indices in loader:
        images, labels = to_device(raw_images, raw_labels, device, channels_last)
        with precision.autocast(device, amp_dtype):
            predicted = model(images)[0].argmax(dim=1)
        valid = labels != IGNORE_INDEX
        groups = group[indices.to(device)].view(-1, 1, 1).expand_as(labels)
        codes = (groups * k + labels) * k + predicted
        counts += torch.bincount(codes[valid], minlength=counts.numel())
    distributed.all_reduce_sum(counts)
    return {name: matrix.cpu() for name, matrix in zip(names, counts.view(len(names), k, k), strict=True)}


def _scores(matrix: torch.Tensor, classes: Sequence[str]) -> dict[str, Any]:
    confusion = ConfusionMatrix(len(classes))
    confusion.matrix = matrix.clone()
    return {"miou": round(confusion.miou(), 6), "per_class_iou": per_class(classes, confusion.iou())}


def evaluation(
    classes: Sequence[str],
    entries: Sequence[Entry],
    candidate: dict[str, torch.Tensor],
    accepted: dict[str, torch.Tensor] | None,
    *,
    held: Sequence[str] = (),
    trained: Sequence[Entry] = (),
) -> dict[str, Any]:
    """`metrics.json`'s `evaluation`: each batch's validation pairs, the trusted set, and the
    batches the candidate trained on (the ones an accepted run makes trusted)."""
    trusts: dict[str, set[str]] = {}
    pairs: dict[str, int] = {}
    for entry in entries:
        trusts.setdefault(entry.batch, set()).add(entry.trust)
        pairs[group_of(entry)] = pairs.get(group_of(entry), 0) + 1
    by_batch: dict[str, list[str]] = {}
    for name in candidate:
        by_batch.setdefault(name.removesuffix(TRUSTED_GROUP), []).append(name)
    batches: dict[str, Any] = {}
    for name in sorted(set(by_batch) | set(held)):
        groups = by_batch.get(name, [])
        batches[name] = {
            "trust": "/".join(sorted(trusts.get(name, {"new"}))),
            "held": name in held,
            "val_pairs": sum(pairs.get(group, 0) for group in groups),
            "candidate": _scores(_sum(candidate, groups), classes) if groups else None,
            "accepted": _scores(_sum(accepted, groups), classes) if accepted and _has(accepted, groups) else None,
        }
    gate = sorted(name for name in candidate if name.endswith(TRUSTED_GROUP))
    trusted: dict[str, Any] = {
        "batches": [name.removesuffix(TRUSTED_GROUP) for name in gate],
        "pairs": sum(pairs.get(name, 0) for name in gate),
    }
    if gate:
        trusted["candidate"] = _scores(_sum(candidate, gate), classes)
        if accepted and _has(accepted, gate):
            trusted["accepted"] = _scores(_sum(accepted, gate), classes)
    trained_batches = sorted({entry.batch for entry in trained})
    return {"batches": batches, "trusted": trusted, "trained_batches": trained_batches}


def _sum(matrices: dict[str, torch.Tensor], groups: Sequence[str]) -> torch.Tensor:
    return sum((matrices[name] for name in groups), torch.zeros_like(next(iter(matrices.values()))))


def _has(matrices: dict[str, torch.Tensor], groups: Sequence[str]) -> bool:
    return bool(groups) and all(name in matrices for name in groups)


def baseline(
    model: nn.Module,
    dataset: SegmentationDataset,
    classes: Sequence[str],
    device: torch.device,
    batch_size: int,
) -> dict[str, Any]:
    """The accepted model on this run's validation pairs (`metrics.json`'s `baseline`), with its
    per-batch confusion matrices, kept in checkpoints so a resumed run need not score it again."""
    by_batch = confusion_by_batch(model, dataset, len(classes), device, batch_size=batch_size)
    total = sum(by_batch.values(), torch.zeros(len(classes), len(classes), dtype=torch.long))
    scores = _scores(total, classes)
    name = getattr(model, "source", "the accepted model")
    log.info("accepted model %s on this run's validation pairs: mIoU %.4f", name, scores["miou"])
    return {"model": name, **scores, "confusion_by_batch": {k: v.tolist() for k, v in by_batch.items()}}


def from_lists(baseline: dict[str, Any] | None) -> dict[str, torch.Tensor] | None:
    """The per-batch matrices `baseline` kept (None without an accepted model)."""
    if not baseline or "confusion_by_batch" not in baseline:
        return None
    return {name: torch.tensor(matrix, dtype=torch.long) for name, matrix in baseline["confusion_by_batch"].items()}
