"""The accepted model as the judge of labels: per pair, its probabilities at the screening scale
and an embedding of the scene (`rule.Familiarity`), fed by the loader's workers.

`phase.py` runs it over the calibration pairs and then every pair it screens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import Dataset, SequentialSampler

from trainer.data import SegmentationDataset, to_device
from trainer.loader import make_loader

MIN_WIDTH = 256  # the narrowest the model screens at


class _Indexed(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    def __init__(self, dataset: SegmentationDataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        index = self.indices[position]
        return (index, *self.dataset[index])


def _as_list(items: list[tuple[int, torch.Tensor, torch.Tensor]]) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    return items  # pairs of several sizes: the main process groups them


class Screener:
    """The accepted model, in eval mode, turned into per-pixel probabilities and, per scene, an
    embedding of what it sees (its context branch, pooled: `rule.Familiarity`)."""

    def __init__(
        self, model: nn.Module, device: torch.device, scale: float, batch_size: int = 8, workers: int = 0
    ) -> None:
        self.model, self.device, self.scale = model.eval(), device, scale
        self.batch_size, self.workers = batch_size, workers
        self._context: list[torch.Tensor] = []
        semantic = getattr(model, "semantic", None)
        if isinstance(semantic, nn.Module):
            # The semantic branch's last stage (BiSeNetV2's context embedding), as it passes by.
            semantic.register_forward_hook(lambda _module, _inputs, stages: self._context.append(stages[-1]))

    @torch.inference_mode()
    def probabilities(self, raw_images: torch.Tensor, raw_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, K, h, w) probabilities and the (N, h, w) labels at the screening scale."""
        probs, labels, _ = self.judge(raw_images, raw_labels)
        return probs, labels

    @torch.inference_mode()
    def judge(
        self, raw_images: torch.Tensor, raw_labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Probabilities and labels at the screening scale, and (N, D) unit scene embeddings."""
        images, labels = to_device(raw_images, raw_labels, self.device, False)
        # Never below MIN_WIDTH pixels across: small images shrunk further lose what the model
        # needs to recognise anything (and cost little at full size).
        scale = min(1.0, max(self.scale, MIN_WIDTH / images.shape[-1]))
        if scale != 1.0:
            images = F.interpolate(images, scale_factor=scale, mode="bilinear", align_corners=False)
        self._context.clear()
        logits = self.model(images)[0].float()
        labels = F.interpolate(labels.unsqueeze(1).float(), size=logits.shape[-2:], mode="nearest").long()
        probs = logits.softmax(dim=1)
        # A model without a context branch is described by its mean prediction instead.
        pooled = self._context[-1].float().mean(dim=(2, 3)) if self._context else probs.mean(dim=(2, 3))
        return probs, labels[:, 0], F.normalize(pooled, dim=1).cpu()

    def each(
        self, dataset: SegmentationDataset, indices: Sequence[int]
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(index, probabilities, labels, embedding) per pair: the loader's workers decode, the
        model runs on batches of same-sized pairs (a forward per pair costs several times as much)."""
        if not indices:
            return
        subset = _Indexed(dataset, indices)
        loader = make_loader(
            subset,
            batch_size=self.batch_size,
            sampler=SequentialSampler(subset),
            workers=self.workers,
            pin_memory=False,
            collate_fn=_as_list,
        )
        for chunk in loader:
            by_size: dict[tuple[int, ...], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
            for item in chunk:
                by_size.setdefault(tuple(item[1].shape), []).append(item)
            for group in by_size.values():
                probs, labels, embeddings = self.judge(
                    torch.stack([g[1] for g in group]), torch.stack([g[2] for g in group])
                )
                for offset, (index, _, _) in enumerate(group):
                    yield index, probs[offset], labels[offset], embeddings[offset]
