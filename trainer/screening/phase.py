"""The first phase of a run with an accepted model: screen the version's new batches, hold the
ones the model confidently contradicts, and leave pictures of their worst pairs for people.

Every pair carries its batch's *trust* in the manifest (the trigger writes it when it freezes the
version, from the ledger): `trusted` (an accepted run trained on it), `new` (not yet judged),
`released` (held once, let in by an operator: screened and reported, never held again by us) and
`benchmark` (the team's evaluation set: never trained on). The thresholds come from up to
`calibration_pairs` trusted pairs, and so do the confusions and predictions the hold rule
compares each batch with (`screening.HoldRule`);
with no trusted pair (a version frozen before batches had a trust) they come from the screened
pairs themselves, as cleanlab does, and the result says so.

Each rank screens every `world_size`-th pair; the tallies travel to every rank, so all of them
hold the same batches. Rank 0 writes `screening.json` and the pictures under `screening/`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from PIL import Image
from torch import nn

from trainer import checkpoint, distributed
from trainer.build import baseline_model as build_baseline
from trainer.data import Entry, SegmentationDataset, parse_size, read_manifest, to_device
from trainer.decode import ImageDecoder, pick_decoder
from trainer.model import BiSeNetV2
from trainer.screening.rule import NO_THRESHOLD, HoldRule, SelfConfidence, Tally, likely_errors

log = logging.getLogger("trainer")

TRUSTED, NEW, RELEASED, BENCHMARK = "trusted", "new", "released", "benchmark"
SCREENED = (NEW, RELEASED)
# The official Cityscapes colours of the train ids (functions/common/taxonomy.py has the same;
# the trainer imports nothing from functions/, and a test checks that the two agree).
CITYSCAPES_COLORS: tuple[tuple[int, int, int], ...] = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153),
    (153, 153, 153), (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152),
    (70, 130, 180), (220, 20, 60), (255, 0, 0), (0, 0, 142), (0, 0, 70),
    (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32),
)  # fmt: skip
PICTURE_WIDTH = 192  # each of the four panels of a pair's picture
MIN_WIDTH = 256  # the narrowest the model screens at


@dataclass
class Settings:
    rule: HoldRule = field(default_factory=HoldRule)
    scale: float = 0.5  # the model sees the pairs at this scale: a share needs no fine detail
    calibration_pairs: int = 64
    worst: int = 3  # pictures per held or suspect batch


@dataclass
class Screening:
    """What the phase found; `to_json()` is `screening.json`."""

    model: str
    calibration: str
    reference_pairs: int
    reference_share: float
    rule: HoldRule
    thresholds: dict[str, float | None]
    batches: dict[str, dict[str, Any]]
    seconds: float = 0.0

    @property
    def held(self) -> list[str]:
        return sorted(name for name, batch in self.batches.items() if batch["held"])

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "model": self.model,
            "calibration": self.calibration,
            "reference_pairs": self.reference_pairs,
            "reference_share": round(self.reference_share, 6),
            "rule": {"margin": self.rule.margin, "unfamiliar": self.rule.unfamiliar},
            "thresholds": self.thresholds,
            "held": self.held,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
        }


class Screener:
    """The accepted model, in eval mode, turned into per-pixel probabilities."""

    def __init__(self, model: nn.Module, device: torch.device, scale: float, batch_size: int = 8) -> None:
        self.model, self.device, self.scale, self.batch_size = model.eval(), device, scale, batch_size

    @torch.inference_mode()
    def probabilities(self, raw_images: torch.Tensor, raw_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, K, h, w) probabilities and the (N, h, w) labels at the screening scale."""
        images, labels = to_device(raw_images, raw_labels, self.device, False)
        # Never below MIN_WIDTH pixels across: small images shrunk further lose what the model
        # needs to recognise anything (and cost little at full size).
        scale = min(1.0, max(self.scale, MIN_WIDTH / images.shape[-1]))
        if scale != 1.0:
            images = F.interpolate(images, scale_factor=scale, mode="bilinear", align_corners=False)
        logits = self.model(images)[0].float()
        labels = F.interpolate(labels.unsqueeze(1).float(), size=logits.shape[-2:], mode="nearest").long()
        return logits.softmax(dim=1), labels[:, 0]

    def each(
        self, dataset: SegmentationDataset, indices: Sequence[int]
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(index, probabilities, labels) per pair, the model run on batches of same-sized pairs
        (a forward per pair would cost several times as much on a CPU, and on a GPU too)."""
        for start in range(0, len(indices), self.batch_size):
            chunk = [(index, *dataset[index]) for index in indices[start : start + self.batch_size]]
            by_size: dict[tuple[int, ...], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
            for item in chunk:
                by_size.setdefault(tuple(item[1].shape), []).append(item)
            for group in by_size.values():
                probs, labels = self.probabilities(
                    torch.stack([g[1] for g in group]), torch.stack([g[2] for g in group])
                )
                for offset, (index, _, _) in enumerate(group):
                    yield index, probs[offset], labels[offset]


# The reference is estimated on every REFERENCE_STRIDE-th pixel of each reference pair's
# rows and columns, kept from the first pass: a share needs no full resolution, and so trusted
# pairs are run through the model once, not twice.
REFERENCE_STRIDE = 4


def screen_version(
    screener: Screener,
    dataset: SegmentationDataset,
    entries: Sequence[Entry],
    classes: list[str],
    settings: Settings,
    *,
    model_name: str,
) -> Screening:
    """Screen every pair of a new or released batch of `entries` (indices into `dataset`)."""
    started = time.perf_counter()
    rank, world = _rank_and_world()
    screened = [i for i, entry in enumerate(entries) if entry.trust in SCREENED]
    trusted = [i for i, entry in enumerate(entries) if entry.trust == TRUSTED]
    # Spread over every trusted batch (the manifest is in batch order), not the first one's pairs.
    trusted = trusted[:: max(1, len(trusted) // settings.calibration_pairs)][: settings.calibration_pairs]
    calibration = "trusted pairs" if trusted else "the screened pairs themselves (no trusted pair yet)"
    reference = trusted or screened

    # Pass 1: the thresholds, the model's average self-confidence per class on the reference,
    # keeping a thinned copy of each reference pair for the reference share.
    confidence = SelfConfidence(len(classes))
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _, probs, labels in screener.each(dataset, reference[rank::world]):
        confidence.update(probs, labels)
        thin = (slice(None, None, REFERENCE_STRIDE), slice(None, None, REFERENCE_STRIDE))
        kept.append((probs[(slice(None), *thin)].half().cpu(), labels[thin].cpu()))
    distributed.all_reduce_sum(confidence.sums)
    distributed.all_reduce_sum(confidence.counts)
    thresholds = confidence.thresholds()
    reference_tally = Tally(len(classes))
    for probs, labels in kept:
        reference_tally.add(probs.float(), labels, thresholds)

    # Pass 2: every screened pair's verdict.
    per_batch: dict[str, Tally] = {}
    qualities: list[tuple[str, int, float]] = []
    for index, probs, labels in screener.each(dataset, screened[rank::world]):
        batch = entries[index].batch
        tally = per_batch.setdefault(batch, Tally(len(classes)))
        qualities.append((batch, index, tally.add(probs, labels, thresholds)))
    gathered = distributed.gather_objects((reference_tally, per_batch, qualities))
    for source, (other_ref, other_batches, other_qualities) in enumerate(gathered):
        if source == rank:
            continue
        reference_tally.merge(other_ref)
        for name, tally in other_batches.items():
            per_batch.setdefault(name, Tally(len(classes))).merge(tally)
        qualities.extend(other_qualities)

    share, rule = reference_tally.share, settings.rule
    batches: dict[str, dict[str, Any]] = {}
    for name, tally in sorted(per_batch.items()):
        trust = next(entry.trust for entry in entries if entry.batch == name)
        excess, unfamiliar = tally.excess_share(reference_tally), tally.unfamiliarity(reference_tally)
        above = rule.holds(excess, unfamiliar)
        held = above and trust == NEW  # an operator's release stands
        worst = sorted((q, i) for b, i, q in qualities if b == name)[: settings.worst]
        batches[name] = {
            "trust": trust,
            "pairs": tally.pairs,
            "pixels": tally.pixels,
            "likely_errors": tally.flagged,
            "share": round(tally.share, 6),
            "excess": round(excess, 6),
            "unfamiliarity": round(unfamiliar, 4),
            "held": held,
            "above_bar": above,
            "confusions": tally.confusions(classes, reference_tally),
            "worst_pairs": [
                {"image": entries[i].image, "label": entries[i].label, "quality": round(q, 4)} for q, i in worst
            ],
            "reasons": _reasons(tally, reference_tally, rule, classes, held=held, trust=trust),
        }
    return Screening(
        model=model_name,
        calibration=calibration,
        reference_pairs=reference_tally.pairs,
        reference_share=share,
        rule=rule,
        thresholds={
            name: (None if not np.isfinite(value) else round(float(value), 4))
            for name, value in zip(classes, thresholds.tolist(), strict=True)
        },
        batches=batches,
        seconds=time.perf_counter() - started,
    )


def _reasons(
    tally: Tally, reference: Tally, rule: HoldRule, classes: list[str], *, held: bool, trust: str
) -> list[str]:
    excess, unfamiliar = tally.excess_share(reference), tally.unfamiliarity(reference)
    found = [
        f"{100 * tally.share:.1f} % of its labelled pixels contradict the accepted model "
        f"({100 * reference.share:.1f} % on trusted pairs); {100 * excess:.1f} % beyond the model's "
        f"usual confusions (held from {100 * rule.margin:.0f} %)"
    ]
    if unfamiliar > rule.unfamiliar:
        found.append(
            f"the model does not know these scenes (its predictions differ from those on trusted pairs by "
            f"{100 * unfamiliar:.0f} %, above {100 * rule.unfamiliar:.0f} %): not judged, trained on"
        )
        return found
    if excess < rule.margin:
        return [*found, "within what the model shows on labels it trusts"]
    found += [c["text"] for c in tally.confusions(classes, reference)]
    if not held and trust == RELEASED:
        found.append("released by an operator: trained on, not held again")
    return found


def write_pictures(
    screener: Screener, dataset: SegmentationDataset, entries: Sequence[Entry], screening: Screening, folder: Path
) -> None:
    """Rank 0: for the worst pairs of each batch above the bar, the image, its label, the model's
    prediction and the disagreement side by side, one small PNG each, under `folder/<batch>/`."""
    thresholds = torch.tensor(
        [NO_THRESHOLD if value is None else value for value in screening.thresholds.values()], dtype=torch.float64
    )
    by_image = {entry.image: index for index, entry in enumerate(entries)}
    for name, batch in screening.batches.items():
        if not batch["above_bar"]:
            continue
        for number, pair in enumerate(batch["worst_pairs"], start=1):
            raw_image, raw_label = dataset[by_image[pair["image"]]]
            probs, labels = screener.probabilities(raw_image.unsqueeze(0), raw_label.unsqueeze(0))
            flagged, _ = likely_errors(probs[0], labels[0], thresholds)
            picture = _side_by_side(raw_image, labels[0], probs[0].argmax(dim=0), flagged)
            path = folder / name / f"{number}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            picture.save(path, optimize=True)
            pair["picture"] = f"screening/{name}/{number}.png"


def _side_by_side(
    raw_image: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor, flagged: torch.Tensor
) -> Image.Image:
    height = max(1, round(PICTURE_WIDTH * labels.shape[0] / labels.shape[1]))
    size = (PICTURE_WIDTH, height)
    palette = np.zeros((256, 3), dtype=np.uint8)
    palette[: len(CITYSCAPES_COLORS)] = CITYSCAPES_COLORS
    image = Image.fromarray(raw_image.permute(1, 2, 0).numpy()).resize(size, Image.Resampling.BILINEAR)
    label = Image.fromarray(palette[labels.cpu().numpy().astype(np.uint8)]).resize(size, Image.Resampling.NEAREST)
    guess = Image.fromarray(palette[predicted.cpu().numpy().astype(np.uint8)]).resize(size, Image.Resampling.NEAREST)
    grey = np.asarray(image.convert("L").convert("RGB"), dtype=np.uint8).copy()
    mask = np.asarray(Image.fromarray(flagged.cpu().numpy().astype(np.uint8) * 255).resize(size)) > 127
    grey[mask] = (230, 30, 30)
    canvas = Image.new("RGB", (PICTURE_WIDTH * 4 + 6, height), (255, 255, 255))
    for column, panel in enumerate((image, label, guess, Image.fromarray(grey))):
        canvas.paste(panel, (column * (PICTURE_WIDTH + 2), 0))
    return canvas


def _rank_and_world() -> tuple[int, int]:
    if distributed.is_distributed():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("label screening (trainer/screening/)")
    group.add_argument(
        "--screen-labels",
        type=lambda text: text.strip().lower() in {"true", "1", "yes", "y", "on"},
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="with an accepted model, screen new batches first and hold the ones it contradicts",
    )
    group.add_argument(
        "--hold-unfamiliar",
        type=float,
        default=HoldRule.unfamiliar,
        help="never hold a batch whose predictions differ more than this from those on trusted pairs",
    )
    group.add_argument(
        "--hold-margin",
        type=float,
        default=HoldRule.margin,
        help="hold a batch whose likely errors beyond the model's usual confusions reach this share",
    )
    group.add_argument("--screening-scale", type=float, default=Settings.scale, help="the scale the model screens at")


def load_model(path: str, classes: list[str], device: torch.device) -> nn.Module:
    """The accepted model, for screening and for the comparison with the candidate."""
    document = checkpoint.load_model_document(Path(path))
    if document["classes"] != classes:
        raise SystemExit(f"the accepted model {path} predicts other classes than this run")
    model = BiSeNetV2(len(classes), width=document["width"], aux=False).to(device)
    model.load_state_dict(document["state_dict"])
    model.source = path  # type: ignore[assignment]  # named in the logs and metrics.json
    return model.eval()


def before_training(
    args: argparse.Namespace, context: distributed.Context, classes: list[str], manifest: Path
) -> tuple[nn.Module | None, Screening | None]:
    """The accepted model (if the job has one) and what screening the version with it found."""
    path = build_baseline(args)
    if path is None:
        log.info("label screening: no accepted model yet, so nothing to screen with; every batch is trained on")
        return None, None
    model = load_model(path, classes, context.device)
    return model, phase(args, context, model, model_name=path, classes=classes, manifest=manifest)


def phase(
    args: argparse.Namespace,
    context: distributed.Context,
    model: nn.Module,
    *,
    model_name: str,
    classes: list[str],
    manifest: Path,
) -> Screening | None:
    """Screen the version's new and released batches; rank 0 writes `screening.json` and the
    pictures beside `metrics.json`. None when screening is off or nothing is new."""
    if not args.screen_labels:
        log.info("label screening is off (--screen-labels false): every batch is trained on")
        return None
    entries = read_manifest(manifest)
    if not any(entry.trust in SCREENED for entry in entries):
        log.info("label screening: no new or released batch in this version")
        return None
    base_size = parse_size(args.base_size) if args.base_size else None
    dataset = SegmentationDataset(
        Path(args.data_dir), entries, None, base_size, ImageDecoder(pick_decoder(args.decoder))
    )
    screener = Screener(model, context.device, args.screening_scale)
    settings = Settings(rule=HoldRule(args.hold_margin, args.hold_unfamiliar), scale=args.screening_scale)
    screening = screen_version(screener, dataset, entries, classes, settings, model_name=model_name)
    if context.is_main:
        output = Path(args.output_data_dir)
        write_pictures(screener, dataset, entries, screening, output / "screening")
        output.mkdir(parents=True, exist_ok=True)
        (output / "screening.json").write_text(json.dumps(screening.to_json(), indent=2), encoding="utf-8")
    log.info(
        "label screening (%s, %.1f s): %d batches; %.1f %% likely errors on %d reference pairs",
        screening.calibration,
        screening.seconds,
        len(screening.batches),
        100 * screening.reference_share,
        screening.reference_pairs,
    )
    for name, batch in screening.batches.items():
        verdict = "HELD" if batch["held"] else "released, not held" if batch["above_bar"] else "ok"
        log.info("  %s: %d pairs, %.1f %% likely errors: %s", name, batch["pairs"], 100 * batch["share"], verdict)
        if batch["above_bar"]:
            for reason in batch["reasons"][1:]:
                log.info("    %s", reason)
    return screening


def summary(screening: Screening | None, have_model: bool) -> dict[str, Any]:
    """What `metrics.json` says of the screening; the details are in `screening.json`."""
    if screening is None:
        why = "screening was off or no batch was new" if have_model else "no accepted model yet: nothing to screen with"
        return {"screened": False, "why": why, "held": []}
    return {
        "screened": True,
        "file": "screening.json",
        "calibration": screening.calibration,
        "reference_share": round(screening.reference_share, 6),
        "rule": {"margin": screening.rule.margin, "unfamiliar": screening.rule.unfamiliar},
        "held": screening.held,
        "batches": {
            name: {k: batch[k] for k in ("trust", "pairs", "share", "excess", "unfamiliarity", "held")}
            for name, batch in screening.batches.items()
        },
    }
