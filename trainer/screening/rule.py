"""Label screening: does the accepted model confidently contradict a new batch's labels?

Confident learning (Northcutt, Jiang and Chuang, "Confident Learning: Estimating Uncertainty in
Dataset Labels", JAIR 2021), per pixel as in `cleanlab.segmentation`: class k's threshold is the
model's average self-confidence, the mean probability it gives k on pixels labelled k. A pixel
labelled i is a *likely label error* when the model's probability for some other class j reaches
j's threshold (it is as sure of j as it usually is when j is right) and its prediction is not i.
The class it is sure of is the most probable such j. Unlike cleanlab, which estimates the
thresholds from the very labels it checks, the thresholds here come from *trusted* pairs (those
of batches an accepted run trained on): a batch whose masks swap two classes would otherwise
lower the thresholds it is judged by.

Why this tells bad labels from new scenes: on scenes the model does not know yet (another city,
night, rain) its probabilities spread out and rarely reach a threshold, so few pixels count: the
model is unsure, not contradicting. On a batch exported with the wrong class map it is as sure as
ever, of another class, on most of the swapped classes' pixels. A batch is *held* when its share
of likely errors is far above what the same model shows on trusted pairs (`HoldRule`), so the
rule follows the model's quality: a weak model's own error rate raises the bar.

Everything here is pure torch on tensors the caller provides; `phase.py` runs it over a
dataset version with the accepted model. `tests/trainer/test_screening.py` checks the rule
against cleanlab's on a fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE_INDEX = 255
# A class with no trusted pixel has no threshold: the model is never "as sure as usual" of it.
NO_THRESHOLD = float("inf")


@dataclass(frozen=True)
class HoldRule:
    """A batch is held when the accepted model knows its scenes and still contradicts its labels
    far more than it contradicts trusted labels.

    - *excess*: per (labelled, seen) class pair, the batch's rate of likely errors among the
      labelled class's pixels less the rate on trusted pairs, summed over the pairs and weighed
      by the batch's pixels: the likely errors a model of this quality does not make on labels
      it trusts. Held from `margin` up. A weak model confuses sidewalk and road on trusted labels
      too; that confusion is its own, not the batch's, and does not count.
    - *unfamiliarity*: how far the model's predicted classes on the batch are from its
      predictions on trusted pairs (total variation of the two class distributions). Above
      `unfamiliar`, the model does not know these scenes (night, rain, another city: it sees
      road everywhere, say) and its disagreement says nothing about the labels: reported, not
      held. Labels exported with a wrong class map leave the predictions as they were.
    """

    margin: float = 0.15
    unfamiliar: float = 0.20

    def holds(self, excess: float, unfamiliarity: float) -> bool:
        return excess >= self.margin and unfamiliarity <= self.unfamiliar


class SelfConfidence:
    """Running sums for the per-class thresholds: the mean of p_k over pixels labelled k."""

    def __init__(self, num_classes: int) -> None:
        self.sums = torch.zeros(num_classes, dtype=torch.float64)
        self.counts = torch.zeros(num_classes, dtype=torch.float64)

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        """`probs` (K, ...) probabilities, `labels` (...) train ids (255: ignored)."""
        num_classes = probs.shape[0]
        flat_probs, flat_labels = probs.reshape(num_classes, -1), labels.reshape(-1).long()
        valid = flat_labels != IGNORE_INDEX
        given = flat_labels[valid]
        own = flat_probs[:, valid].gather(0, given.unsqueeze(0)).squeeze(0)
        self.sums += torch.bincount(given, weights=own.double(), minlength=num_classes)[:num_classes].cpu()
        self.counts += torch.bincount(given, minlength=num_classes)[:num_classes].double().cpu()

    def thresholds(self) -> torch.Tensor:
        seen = self.counts > 0
        return torch.where(seen, self.sums / self.counts.clamp(min=1), torch.full_like(self.sums, NO_THRESHOLD))


def likely_errors(
    probs: torch.Tensor, labels: torch.Tensor, thresholds: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pixel: is it a likely label error, and which class is the model sure of there.

    `probs` (K, H, W), `labels` (H, W), `thresholds` (K). Returns a bool mask (H, W) and the
    sure class (H, W; meaningful where the mask is set).
    """
    num_classes = probs.shape[0]
    labels = labels.long()
    valid = labels != IGNORE_INDEX
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    sure = probs >= thresholds.to(probs.device, probs.dtype).view(num_classes, *([1] * (probs.dim() - 1)))
    # The labelled class itself never counts against its label.
    sure.scatter_(0, safe.unsqueeze(0), False)
    candidates = torch.where(sure, probs, torch.full_like(probs, -1.0))
    seen = candidates.argmax(dim=0)
    flagged = valid & sure.any(dim=0) & (probs.argmax(dim=0) != labels)
    return flagged, seen


@dataclass
class Tally:
    """What screening found on some pairs: labelled pixels, likely errors, and which class was
    seen where which was labelled (a K x K count over the likely errors)."""

    num_classes: int
    pairs: int = 0
    pixels: int = 0
    flagged: int = 0
    labelled: torch.Tensor = field(init=False)
    confusion: torch.Tensor = field(init=False)

    predicted: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.labelled = torch.zeros(self.num_classes, dtype=torch.long)
        self.predicted = torch.zeros(self.num_classes, dtype=torch.long)
        self.confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.long)

    def add(self, probs: torch.Tensor, labels: torch.Tensor, thresholds: torch.Tensor) -> float:
        """One pair's verdicts (`likely_errors`); returns its label quality: the share of its
        labelled pixels the model does not contradict."""
        flagged, seen = likely_errors(probs, labels, thresholds)
        k = self.num_classes
        labels = labels.long()
        valid = labels != IGNORE_INDEX
        pixels = int(valid.sum())
        hits = int(flagged.sum())
        self.pairs += 1
        self.pixels += pixels
        self.flagged += hits
        self.labelled += torch.bincount(labels[valid].cpu(), minlength=k)[:k]
        self.predicted += torch.bincount(probs.argmax(dim=0)[valid].cpu(), minlength=k)[:k]
        pair_codes = labels[flagged].cpu() * k + seen[flagged].cpu()
        self.confusion += torch.bincount(pair_codes, minlength=k * k)[: k * k].view(k, k)
        return 1.0 - hits / pixels if pixels else 1.0

    def merge(self, other: Tally) -> None:
        self.pairs += other.pairs
        self.pixels += other.pixels
        self.flagged += other.flagged
        self.labelled += other.labelled
        self.predicted += other.predicted
        self.confusion += other.confusion

    @property
    def share(self) -> float:
        return self.flagged / self.pixels if self.pixels else 0.0

    def rates(self) -> torch.Tensor:
        """(K, K): of the pixels labelled i, the share the model confidently sees as j."""
        return self.confusion.double() / self.labelled.double().clamp(min=1).unsqueeze(1)

    def excess(self, reference: Tally) -> torch.Tensor:
        """(K, K) pixel counts of likely errors beyond the reference's rates (`HoldRule`)."""
        beyond = (self.rates() - reference.rates()).clamp(min=0)
        return beyond * self.labelled.double().unsqueeze(1)

    def excess_share(self, reference: Tally) -> float:
        return float(self.excess(reference).sum()) / self.pixels if self.pixels else 0.0

    def unfamiliarity(self, reference: Tally) -> float:
        """Total variation between the model's predicted classes here and on the reference."""
        mine = self.predicted.double() / max(1, int(self.predicted.sum()))
        theirs = reference.predicted.double() / max(1, int(reference.predicted.sum()))
        return 0.5 * float((mine - theirs).abs().sum())

    def confusions(self, classes: list[str], reference: Tally | None = None, top: int = 3) -> list[dict[str, Any]]:
        """The largest (labelled, seen) disagreements beyond the reference's, each with its share
        of the labelled class's pixels: "labelled sky where the model sees road: 87 % of those
        pixels (1 % on trusted pairs)"."""
        weights = self.excess(reference) if reference is not None else self.confusion.double()
        mine, theirs = self.rates(), reference.rates() if reference is not None else None
        found = []
        flat = weights.flatten()
        for code in torch.argsort(flat, descending=True)[:top].tolist():
            if float(flat[code]) <= 0:
                break
            given, seen = divmod(code, self.num_classes)
            of_label = float(mine[given, seen])
            text = f"labelled {classes[given]} where the model sees {classes[seen]}: "
            text += f"{100 * of_label:.0f} % of those pixels"
            if theirs is not None:
                text += f" ({100 * float(theirs[given, seen]):.0f} % on trusted pairs)"
            found.append(
                {
                    "labelled": classes[given],
                    "seen": classes[seen],
                    "pixels": int(self.confusion[given, seen]),
                    "share_of_labelled": round(of_label, 4),
                    "text": text,
                }
            )
        return found
