"""The label-error rule: which pixels, pairs, classes and batches the accepted model contradicts.

Confident learning (Northcutt, Jiang and Chuang, JAIR 2021), per pixel as in `cleanlab.segmentation`:
class k's threshold is the model's average self-confidence, the mean probability it gives k on
pixels labelled k. The model *confidently sees* class j at a pixel when j is its prediction there
and its probability reaches j's threshold. A pixel labelled i where it confidently sees j != i is
a *likely label error*. Everything is measured against a calibration, fitted on labels the model
did not learn from (trusted validation pairs and the benchmark, `phase.py` chooses them):

- thresholds, as above, so a batch whose masks swap two classes cannot lower its own bar;
- competence: a class is judged only where the model's IoU on those labels reaches
  `Rule.competence`. A model that never learned poles (or learned them wrong) says nothing of
  anybody's poles;
- usual confusions: per (labelled, seen) class pair, the rate of likely errors on calibration
  labels. A model of this quality makes those mistakes on correct labels too, so only likely
  errors beyond them count ("excess");
- coverage: the share of a pair's labelled pixels the model is confident of. On scenes it does not
  know (night, another kind of road) it is rarely confident, and says nothing there.

Then per pair (`PairCounts`): its excess share, its coverage and a label-quality score, the
soft-minimum of the labelled class's probability over its pixels (Lad and Mueller 2023, cleanlab's
`get_label_quality_scores(method="softmin")`), which ranks the pairs to fix. A pair is
*contradicted* when its excess reaches the calibration's bar (`Calibration.pair_bar`), and *not
judged* when its coverage is far below the calibration pairs'. Per batch (`judge_batch`): the share
of its judged pairs contradicted, and per class, in both directions, how much of it the batch
labels otherwise: "labelled sidewalk where the model sees person: 85 % of the person pixels the
model sees" is found however small a share of all pixels people are.

Pure torch on tensors the caller provides; `tests/trainer/test_screening.py` checks it on
fixtures and against cleanlab.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE_INDEX = 255
# A class with no calibration pixel has no threshold: the model is never "as sure as usual" of it.
NO_THRESHOLD = float("inf")


@dataclass(frozen=True)
class Rule:
    """The rule's settings (the trainer's `--screen-*` flags)."""

    competence: float = 0.3  # a class is judged where the model's calibration IoU reaches this
    min_coverage: float = 0.5  # a pair is judged when its coverage reaches this share of the usual
    pair_margin: float = 0.04  # the pair bar is at least this share of its pixels beyond the usual ...
    pair_quantile: float = 0.98  # ... and this quantile of the calibration pairs' excess ...
    pair_factor: float = 1.5  # ... times this: calibration pairs are few, a clean pair must rarely pass
    batch_margin: float = 0.3  # a batch is held when this share of its judged pairs is contradicted
    class_margin: float = 0.5  # ... or a class is relabelled this much beyond the usual
    min_class_pixels: int = 200  # a class finding needs this many pixels (at the screening scale)
    min_class_pairs: int = 3  # ... in this many pairs
    min_class_share: float = 0.2  # ... and in this share of the batch's judged pairs (systematic)
    swap_share: float = 0.5  # on an unfamiliar scene, a pair is contradicted only by a two-way swap this large
    min_judged_share: float = 0.5  # a batch is judged when this share of its pairs is
    temperature: float = 0.1  # of the soft-minimum (cleanlab's default)
    familiar_k: int = 3  # familiarity: the k-th nearest calibration scene ...
    familiar_quantile: float = 0.95  # ... no farther than this quantile of the calibration's own ...
    familiar_margin: float = 1.2  # ... times this


def self_confidence(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each valid pixel's probability of its labelled class (flattened; ignored pixels dropped)."""
    num_classes = probs.shape[0]
    flat_probs, flat_labels = probs.reshape(num_classes, -1), labels.reshape(-1).long()
    valid = flat_labels != IGNORE_INDEX
    return flat_probs[:, valid].gather(0, flat_labels[valid].unsqueeze(0)).squeeze(0)


def soft_min(scores: torch.Tensor, temperature: float) -> float:
    """cleanlab's softmin pooling: the pixel scores weighed by softmax((1 - s) / T), so the lowest
    dominate without one pixel deciding alone."""
    if scores.numel() == 0:
        return 1.0
    weights = torch.softmax((1.0 - scores.double()) / temperature, dim=0)
    return float((scores.double() * weights).sum())


@dataclass
class PairCounts:
    """One pair under one calibration: what was labelled, what the model confidently saw, where
    they differ (K x K: labelled i, seen j), and how sure the model was overall."""

    labelled: torch.Tensor  # (K,) judged pixels labelled k
    seen: torch.Tensor  # (K,) pixels the model confidently sees as k (among labelled pixels)
    errors: torch.Tensor  # (K, K) likely errors: labelled i, confidently seen j
    covered: int  # judged labelled pixels the model is confident of
    quality: float  # soft-minimum self-confidence (cleanlab's label-quality score)
    familiar: bool = True  # a scene like the calibration's (`Familiarity`)

    @property
    def pixels(self) -> int:
        return int(self.labelled.sum())

    @property
    def coverage(self) -> float:
        return self.covered / self.pixels if self.pixels else 0.0

    def excess_pixels(self, usual: torch.Tensor) -> torch.Tensor:
        """(K, K): likely errors beyond `usual` rates (per labelled pixel) for this pair's labels."""
        return (self.errors.double() - usual * self.labelled.double().unsqueeze(1)).clamp(min=0)

    def excess(self, usual: torch.Tensor) -> float:
        return float(self.excess_pixels(usual).sum()) / self.pixels if self.pixels else 0.0

    def swapped_both_ways(self, share: float) -> bool:
        """Two labelled classes i and j with `share` of i's pixels seen as j and of j's seen as i."""
        rates = self.errors.double() / self.labelled.double().clamp(min=1).unsqueeze(1)
        both = (rates >= share) & (rates.t() >= share)
        return bool(both.any())


def count_pair(
    probs: torch.Tensor,
    labels: torch.Tensor,
    thresholds: torch.Tensor,
    judged: torch.Tensor,
    temperature: float = Rule.temperature,
    *,
    familiar: bool = True,
) -> PairCounts:
    """`probs` (K, H, W) and `labels` (H, W) of one pair, under per-class `thresholds` and the
    `judged` classes (K bools).

    On an unfamiliar scene (`familiar` False: a highway for a city model) the model can be sure
    of a class that is not there at all (sidewalk on a highway's verge). There it is heard only
    about classes the pair's labels use somewhere: a swap (sky where it sees road, with road
    labelled elsewhere) is still found; a class it believes it sees and nobody labelled is not."""
    num_classes = probs.shape[0]
    labels = labels.long()
    confidence, predicted = probs.max(dim=0)
    bar = thresholds.to(probs.device, probs.dtype)[predicted]
    judged = judged.to(probs.device)
    valid = labels != IGNORE_INDEX
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    considered = valid & judged[safe]
    confident = considered & (confidence >= bar) & judged[predicted]
    k = num_classes
    labelled = torch.bincount(labels[considered], minlength=k)[:k]
    heard = confident
    if not familiar:
        present = labelled >= max(1, int(PRESENT_SHARE * int(labelled.sum())))
        heard = confident & present[predicted]
    wrong = heard & (predicted != labels)
    seen = torch.bincount(predicted[heard], minlength=k)[:k].cpu()
    codes = labels[wrong] * k + predicted[wrong]
    errors = torch.bincount(codes, minlength=k * k)[: k * k].view(k, k).cpu()
    return PairCounts(
        labelled=labelled.cpu(),
        seen=seen,
        errors=errors,
        covered=int(confident.sum()),
        quality=soft_min(self_confidence(probs, labels), temperature),
        familiar=familiar,
    )


# A class counts as labelled in a pair from this share of its judged pixels (a stray pixel does not).
PRESENT_SHARE = 0.005


@dataclass(frozen=True)
class Familiarity:
    """Is a scene like the calibration's, as the model sees it? Deep nearest neighbours (Sun et al.,
    "Out-of-distribution detection with deep nearest neighbors", ICML 2022) on the model's own
    scene embedding (its context branch, pooled, unit length): a pair is familiar when its k-th
    nearest calibration embedding is no farther than the calibration pairs' own k-th nearest
    neighbours are (their `quantile`, times `margin`). Labels play no part: a drop cannot make
    itself unfamiliar by how it is labelled."""

    embeddings: torch.Tensor  # (N, D) of the calibration pairs, unit length
    bar: float
    k: int

    @classmethod
    def fit(cls, embeddings: torch.Tensor, rule: Rule) -> Familiarity:
        if len(embeddings) <= rule.familiar_k:
            return cls(embeddings, float("inf"), rule.familiar_k)
        distances = 1.0 - embeddings @ embeddings.T
        distances.fill_diagonal_(float("inf"))
        own = distances.sort(dim=1).values[:, rule.familiar_k - 1]
        return cls(embeddings, float(own.quantile(rule.familiar_quantile)) * rule.familiar_margin, rule.familiar_k)

    def distance(self, embedding: torch.Tensor) -> float:
        if len(self.embeddings) < self.k:
            return 0.0
        return float((1.0 - self.embeddings @ embedding).sort().values[self.k - 1])

    def familiar(self, embedding: torch.Tensor) -> bool:
        return self.distance(embedding) <= self.bar


@dataclass
class Calibration:
    """What the model does on labels it did not learn from: the yardstick for everything else."""

    thresholds: torch.Tensor  # (K,) float64
    judged: torch.Tensor  # (K,) bool
    iou: torch.Tensor  # (K,) float64, NaN where the calibration has neither label nor prediction
    usual: torch.Tensor  # (K, K) likely errors per labelled pixel (labelled i, seen j)
    usual_miss: torch.Tensor  # (K,) of the pixels the model confidently sees as j, the share labelled otherwise
    coverage: float  # the calibration pairs' median coverage
    pair_bar: float  # a pair is contradicted from this excess share
    pairs: int
    familiarity: Familiarity | None = None  # None: every scene counts as familiar

    def is_familiar(self, embedding: torch.Tensor | None) -> bool:
        return self.familiarity is None or embedding is None or self.familiarity.familiar(embedding)

    def pair_is_judged(self, counts: PairCounts, rule: Rule) -> bool:
        return counts.pixels > 0 and counts.coverage >= rule.min_coverage * self.coverage

    def contradicts(self, counts: PairCounts, rule: Rule) -> bool:
        """On a familiar scene: its likely errors beyond the usual reach the bar. On an unfamiliar
        one, where a model can be sure and wrong in one direction (it sees road wherever it is
        dark), only two classes exchanged both ways count: the signature of a wrong class map."""
        if counts.familiar:
            return counts.excess(self.usual) >= self.pair_bar
        return counts.swapped_both_ways(rule.swap_share)

    def to_json(self, classes: Sequence[str]) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "coverage": round(self.coverage, 4),
            "pair_bar": round(self.pair_bar, 4),
            # None: every scene counts as familiar (no calibration embeddings, or too few of them).
            "familiar_bar": _finite(self.familiarity.bar) if self.familiarity is not None else None,
            "classes": {
                name: {
                    "judged": bool(self.judged[k]),
                    "iou": None if math.isnan(float(self.iou[k])) else round(float(self.iou[k]), 4),
                    "threshold": _finite(float(self.thresholds[k])),
                }
                for k, name in enumerate(classes)
            },
        }


class CalibrationBuilder:
    """Pass 1 over the calibration pairs: self-confidence and the model's confusion per class,
    keeping each pair's probabilities (thinned) for the rates, which need the thresholds first."""

    # Every STRIDE-th row and column is kept: rates need no full resolution, and so the calibration
    # pairs go through the model once, not twice.
    STRIDE = 4

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.sums = torch.zeros(num_classes, dtype=torch.float64)
        self.counts = torch.zeros(num_classes, dtype=torch.float64)
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        k = self.num_classes
        labels = labels.long()
        valid = labels != IGNORE_INDEX
        given = labels[valid]
        own = self_confidence(probs, labels)
        self.sums += torch.bincount(given, weights=own.double(), minlength=k)[:k].cpu()
        self.counts += torch.bincount(given, minlength=k)[:k].double().cpu()
        predicted = probs.argmax(dim=0)[valid]
        self.confusion += torch.bincount(given * k + predicted, minlength=k * k)[: k * k].view(k, k).double().cpu()
        thin = (slice(None, None, self.STRIDE), slice(None, None, self.STRIDE))
        # Kept in full precision: a pixel at its class's threshold must count here as it does in pass 2.
        self.kept.append((probs[(slice(None), *thin)].float().cpu(), labels[thin].cpu()))

    def thresholds(self) -> torch.Tensor:
        seen = self.counts > 0
        return torch.where(seen, self.sums / self.counts.clamp(min=1), torch.full_like(self.sums, NO_THRESHOLD))

    def iou(self) -> torch.Tensor:
        true_positive = self.confusion.diagonal()
        union = self.confusion.sum(dim=0) + self.confusion.sum(dim=1) - true_positive
        return torch.where(union > 0, true_positive / union.clamp(min=1), torch.full_like(union, math.nan))

    def pair_counts(self, rule: Rule) -> list[PairCounts]:
        """The kept calibration pairs, counted under the thresholds and competence found."""
        thresholds, judged = self.thresholds(), self.judged(rule)
        return [count_pair(p, labels, thresholds, judged, rule.temperature) for p, labels in self.kept]

    def judged(self, rule: Rule) -> torch.Tensor:
        iou = self.iou()
        return (~iou.isnan()) & (iou >= rule.competence) & torch.isfinite(self.thresholds())


def calibrate(
    builder: CalibrationBuilder, rule: Rule, counted: Sequence[PairCounts], embeddings: torch.Tensor | None = None
) -> Calibration:
    """The calibration from pass 1's sums (`builder`, reduced over ranks), every calibration
    pair's counts and scene embeddings (`counted`, `embeddings`: gathered from every rank)."""
    k = builder.num_classes
    labelled = sum((c.labelled for c in counted), torch.zeros(k, dtype=torch.long)).double()
    seen = sum((c.seen for c in counted), torch.zeros(k, dtype=torch.long)).double()
    errors = sum((c.errors for c in counted), torch.zeros(k, k, dtype=torch.long)).double()
    usual = errors / labelled.clamp(min=1).unsqueeze(1)
    usual_miss = errors.sum(dim=0) / seen.clamp(min=1)
    coverages = sorted(c.coverage for c in counted if c.pixels)
    excesses = sorted(c.excess(usual) for c in counted if c.pixels)
    return Calibration(
        thresholds=builder.thresholds(),
        judged=builder.judged(rule),
        iou=builder.iou(),
        usual=usual,
        usual_miss=usual_miss,
        coverage=_quantile(coverages, 0.5) if coverages else 0.0,
        pair_bar=max(rule.pair_margin, rule.pair_factor * _quantile(excesses, rule.pair_quantile) if excesses else 0.0),
        pairs=len(counted),
        familiarity=Familiarity.fit(embeddings, rule) if embeddings is not None and len(embeddings) else None,
    )


def _finite(value: float) -> float | None:
    """JSON has no infinity: a bar nothing reaches is written as null."""
    return round(value, 4) if math.isfinite(value) else None


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default) of sorted values."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class ClassFinding:
    """A class the batch labels otherwise, systematically: `seen` where the model sees it, or
    `labelled` where the batch says it; `kind` erased (the batch hardly labels it at all) or
    relabelled (it does, elsewhere)."""

    kind: str
    labelled: str
    seen: str
    share: float  # of the direction's pixels
    usual: float  # the same share on calibration labels
    pixels: int
    pairs: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "labelled": self.labelled,
            "seen": self.seen,
            "share": round(self.share, 4),
            "usual": round(self.usual, 4),
            "pixels": self.pixels,
            "pairs": self.pairs,
            "text": self.text,
        }


@dataclass
class BatchJudgement:
    """What the rule finds in one batch's judged pairs."""

    pairs: int
    judged: int
    contradicted: list[int]  # positions (in the batch's pair list) of contradicted pairs
    findings: list[ClassFinding] = field(default_factory=list)

    @property
    def contradicted_share(self) -> float:
        return len(self.contradicted) / self.judged if self.judged else 0.0


def judge_batch(
    counts: Sequence[PairCounts], calibration: Calibration, rule: Rule, classes: Sequence[str]
) -> BatchJudgement:
    """The rule on one batch: its contradicted pairs, and its systematically relabelled classes."""
    judged = [i for i, c in enumerate(counts) if calibration.pair_is_judged(c, rule)]
    contradicted = [i for i in judged if calibration.contradicts(counts[i], rule)]
    # A class's habits are read on familiar scenes only: on others the model's own mistakes
    # (a highway's verge taken for sidewalk) would read as the batch's.
    familiar = [counts[i] for i in judged if counts[i].familiar]
    return BatchJudgement(
        pairs=len(counts),
        judged=len(judged),
        contradicted=contradicted,
        findings=class_findings(familiar, calibration, rule, classes, out_of=len(judged)),
    )


def class_findings(
    counts: Sequence[PairCounts],
    calibration: Calibration,
    rule: Rule,
    classes: Sequence[str],
    *,
    out_of: int | None = None,
) -> list[ClassFinding]:
    """Per judged class, both directions: of the pixels the model confidently sees as j, how many
    the batch labels otherwise (an erased or merged class); of the pixels the batch labels i, how
    many the model confidently sees as something else (a class written as another)."""
    k = len(classes)
    if not counts:
        return []
    # Systematic: in enough pairs, and in a good share of the batch's (a few stray pairs are not a batch's habit).
    least_pairs = max(rule.min_class_pairs, math.ceil(rule.min_class_share * (out_of or len(counts))))
    labelled = torch.stack([c.labelled for c in counts]).double()  # (P, K)
    seen = torch.stack([c.seen for c in counts]).double()
    errors = sum((c.errors for c in counts), torch.zeros(k, k, dtype=torch.long)).double()
    found: dict[tuple[int, int], ClassFinding] = {}
    for j in range(k):
        total_seen = float(seen[:, j].sum())
        if not calibration.judged[j] or total_seen < rule.min_class_pixels:
            continue
        missed = float(errors[:, j].sum())
        share, usual = missed / total_seen, float(calibration.usual_miss[j])
        pairs = int((seen[:, j] > 0).sum())
        if share - usual < rule.class_margin or pairs < least_pairs:
            continue
        i = int(errors[:, j].argmax())
        erased = float(labelled[:, j].sum()) < 0.25 * total_seen
        text = (
            f"labelled {classes[i]} where the model sees {classes[j]}: {100 * share:.0f} % of the "
            f"{classes[j]} pixels the model sees ({100 * usual:.0f} % on calibration labels)"
        )
        found[(i, j)] = ClassFinding(
            "erased" if erased else "relabelled", classes[i], classes[j], share, usual, int(total_seen), pairs, text
        )
    for i in range(k):
        total = float(labelled[:, i].sum())
        if not calibration.judged[i] or total < rule.min_class_pixels:
            continue
        share, usual = float(errors[i].sum()) / total, float(calibration.usual[i].sum())
        pairs = int((labelled[:, i] > 0).sum())
        j = int(errors[i].argmax())
        if share - usual < rule.class_margin or pairs < least_pairs or (i, j) in found:
            continue
        text = (
            f"labelled {classes[i]} where the model sees {classes[j]}: {100 * share:.0f} % of the "
            f"{classes[i]} pixels ({100 * usual:.0f} % on calibration labels)"
        )
        found[(i, j)] = ClassFinding("relabelled", classes[i], classes[j], share, usual, int(total), pairs, text)
    return sorted(found.values(), key=lambda f: -(f.share - f.usual))


def top_confusion(counts: PairCounts, calibration: Calibration, classes: Sequence[str]) -> str:
    """The pair's largest likely error beyond the usual, in words ("" when there is none)."""
    excess = counts.excess_pixels(calibration.usual)
    if float(excess.max()) <= 0:
        return ""
    i, j = divmod(int(excess.argmax()), len(classes))
    return f"labelled {classes[i]} where the model sees {classes[j]} ({int(counts.errors[i, j])} pixels)"


def merge(parts: Iterable[list[Any]]) -> list[Any]:
    """Lists gathered from every rank, in rank order."""
    return [item for part in parts for item in part]
