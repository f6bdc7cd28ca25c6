"""The first phase of a run with an accepted model: judge every new pair's labels before training.

1. Calibrate (`rule.py`) on labels the accepted model did not learn from: the validation pairs
   of trusted pairs and every benchmark pair (*independent*). With none (the first drops), on the
   validation pairs of the batches the model learned from (*provisional*): never trained on,
   but checked by nobody, so the model's word counts only as far as `verdicts.py` allows.
2. Judge every new or released pair the accepted model did not train on (its *basis*, kept in the
   model file): per pair its excess of likely errors, coverage and label quality; per batch its
   share of contradicted pairs and its systematically relabelled classes.
3. Decide (`verdicts.py`): pairs left out, batches held, disputed or not judged.

Each rank screens every `world_size`-th pair, fed by the loader's workers; the counts travel to
every rank, so every rank leaves out the same pairs. Rank 0 writes `screening.json` and the
pictures (`pictures.py`) beside `metrics.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import checkpoint, distributed
from trainer.build import baseline_model as build_baseline
from trainer.data import Entry, SegmentationDataset, parse_size, read_manifest
from trainer.decode import ImageDecoder, pick_decoder
from trainer.loader import default_workers
from trainer.model import BiSeNetV2
from trainer.screening import pictures
from trainer.screening.pictures import PictureMode
from trainer.screening.rule import (
    BatchJudgement,
    Calibration,
    CalibrationBuilder,
    PairCounts,
    Rule,
    calibrate,
    count_pair,
    judge_batch,
    merge,
    top_confusion,
)
from trainer.screening.screener import Screener
from trainer.screening.verdicts import (
    INDEPENDENT,
    PROVISIONAL,
    BatchCase,
    Decision,
    Decisions,
    decide,
    summary_counts,
)

log = logging.getLogger("trainer")

TRUSTED, NEW, RELEASED, BENCHMARK = "trusted", "new", "released", "benchmark"
SCREENED = (NEW, RELEASED)


def pair_key(entry: Entry) -> str:
    """A pair's content, short: what a model's basis lists (its labels may change; its key with them)."""
    return hashlib.sha256(f"{entry.image_sha256}:{entry.label_sha256}".encode()).hexdigest()[:16]


def team_of(entry: Entry) -> str:
    """The annotation team: batches are named `<team>-<anything>` (the template's AnnotationTeams)."""
    return entry.team or entry.batch.split("-", 1)[0]


@dataclass(frozen=True)
class Basis:
    """What a model learned from: written into its model file, read when it judges."""

    teams: frozenset[str] = frozenset()
    batches: frozenset[str] = frozenset()
    pairs: frozenset[str] = frozenset()
    known: bool = False  # model files from before screening by pair do not say

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> Basis:
        return cls(
            teams=frozenset(team_of(e) for e in entries),
            batches=frozenset(e.batch for e in entries),
            pairs=frozenset(pair_key(e) for e in entries),
            known=True,
        )

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Basis:
        found = document.get("basis")
        if not isinstance(found, dict):
            return cls()
        return cls(
            teams=frozenset(found.get("teams", [])),
            batches=frozenset(found.get("batches", [])),
            pairs=frozenset(found.get("pairs", [])),
            known=True,
        )

    def to_document(self) -> dict[str, Any]:
        return {"teams": sorted(self.teams), "batches": sorted(self.batches), "pairs": sorted(self.pairs)}


@dataclass
class Settings:
    rule: Rule = field(default_factory=Rule)
    scale: float = 0.5  # the model sees the pairs at this scale
    calibration_pairs: int = 64
    pictures: int = 6  # pairs pictured per batch, worst first
    picture_mode: PictureMode = "blur"  # --held-pair-pictures
    workers: int = 0
    batch_size: int = 8


@dataclass
class Screening:
    """What the phase found; `to_json()` is `screening.json`."""

    model: str
    calibration_kind: str
    calibration_text: str
    calibration: Calibration
    classes: list[str]
    rule: Rule
    basis: Basis
    decisions: Decisions
    batches: dict[str, dict[str, Any]]
    seconds: float = 0.0
    picture_mode: PictureMode = "blur"

    @property
    def held(self) -> list[str]:
        return sorted(name for name, d in self.decisions.batches.items() if d.held)

    @property
    def left_out(self) -> list[str]:
        """Images of every pair this run leaves out: those of held batches' new pairs, and the
        contradicted pairs of the others."""
        found = []
        for batch in self.batches.values():
            found += [p["image"] for p in batch["pairs"] if p["verdict"] in ("held", "left out")]
        return sorted(found)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 2,
            "model": self.model,
            "calibration": {
                "kind": self.calibration_kind,
                "text": self.calibration_text,
                **self.calibration.to_json(self.classes),
            },
            "basis": {
                "teams": sorted(self.basis.teams),
                "batches": sorted(self.basis.batches),
                "known": self.basis.known,
            },
            "rule": asdict(self.rule),
            "held": self.held,
            "disputed": self.decisions.disputed,
            "outvoted": self.decisions.outvoted,
            "corroborated_by": self.decisions.corroborated_by,
            "left_out": len(self.left_out),
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            # How its pairs are pictured (blur, show) or that they are not (omit): the report says so.
            "pictures": self.picture_mode,
        }


def _calibration_pairs(entries: Sequence[Entry], basis: Basis, limit: int) -> tuple[list[int], str, str]:
    """Which pairs calibrate, of which kind, in words; spread over every batch (the manifest is in
    batch order), never the first batch's pairs alone."""
    independent = [
        i for i, e in enumerate(entries) if (e.trust == TRUSTED and e.split == "val") or e.trust == BENCHMARK
    ]
    if independent:
        chosen, kind = independent, INDEPENDENT
        text = "labels it did not learn from and that earned trust (trusted validation pairs, the benchmark)"
    else:
        kind = PROVISIONAL
        chosen = [i for i, e in enumerate(entries) if e.split == "val" and e.batch in basis.batches]
        text = "the validation pairs of the batches it learned from (provisional: nobody has checked them)"
        if not chosen:
            chosen = [i for i, e in enumerate(entries) if e.split == "val"]
            text = "every validation pair, the ones it judges included (provisional: its basis is unknown)"
    chosen = chosen[:: max(1, len(chosen) // limit)][:limit]
    return chosen, kind, text


def screen_version(
    screener: Screener,
    dataset: SegmentationDataset,
    entries: Sequence[Entry],
    classes: list[str],
    settings: Settings,
    *,
    model_name: str,
    basis: Basis,
) -> Screening:
    """Judge every new or released pair of `entries` (indices into `dataset`) that the accepted
    model did not train on."""
    started = time.perf_counter()
    rule, k = settings.rule, len(classes)
    rank, world = _rank_and_world()
    calibration_pairs, kind, text = _calibration_pairs(entries, basis, settings.calibration_pairs)

    # Pass 1: thresholds, competence and the scenes it knows, keeping each calibration pair
    # thinned for the rates (which need the thresholds first).
    builder = CalibrationBuilder(k)
    embeddings: list[torch.Tensor] = []
    for _, probs, labels, embedding in screener.each(dataset, calibration_pairs[rank::world]):
        builder.update(probs, labels)
        embeddings.append(embedding)
    for total in (builder.sums, builder.counts, builder.confusion):
        distributed.all_reduce_sum(total)
    everyone = merge(distributed.gather_objects(embeddings))
    calibration = calibrate(
        builder,
        rule,
        merge(distributed.gather_objects(builder.pair_counts(rule))),
        torch.stack(everyone) if everyone else None,
    )

    # Pass 2: every screenable pair, counted under that calibration.
    screened = [i for i, e in enumerate(entries) if e.trust in SCREENED and pair_key(e) not in basis.pairs]
    mine = [
        (
            index,
            count_pair(
                probs,
                labels,
                calibration.thresholds,
                calibration.judged,
                rule.temperature,
                familiar=calibration.is_familiar(embedding),
            ),
        )
        for index, probs, labels, embedding in screener.each(dataset, screened[rank::world])
    ]
    counted: dict[int, PairCounts] = dict(merge(distributed.gather_objects(mine)))

    by_batch: dict[str, list[int]] = {}
    for index in screened:
        by_batch.setdefault(entries[index].batch, []).append(index)
    cases: list[BatchCase] = []
    judged_batches: dict[str, BatchJudgement] = {}
    for name, indices in sorted(by_batch.items()):
        judged_now = judge_batch([counted[i] for i in indices], calibration, rule, classes)
        released = frozenset(p for p, i in enumerate(indices) if entries[i].trust == RELEASED)
        cases.append(BatchCase(name, team_of(entries[indices[0]]), judged_now, released))
        judged_batches[name] = judged_now
    decisions = decide(cases, kind, basis.teams, sorted(basis.batches & {e.batch for e in entries}), rule)

    batches = {
        name: _batch_record(
            [entry for entry in entries if entry.batch == name],
            [(entries[i], counted[i]) for i in by_batch.get(name, [])],
            decisions.batches[name],
            judged_batches.get(name),
            calibration,
            rule,
            classes,
        )
        for name in sorted(decisions.batches)
    }
    return Screening(
        model=model_name,
        calibration_kind=kind,
        calibration_text=text,
        calibration=calibration,
        classes=classes,
        rule=rule,
        basis=basis,
        decisions=decisions,
        batches=batches,
        seconds=time.perf_counter() - started,
        picture_mode=settings.picture_mode,
    )


def _batch_record(  # noqa: PLR0917  # one batch's facts, all of them needed
    members: Sequence[Entry],
    screened: Sequence[tuple[Entry, PairCounts]],
    decision: Decision,
    judgement: BatchJudgement | None,
    calibration: Calibration,
    rule: Rule,
    classes: Sequence[str],
) -> dict[str, Any]:
    """`screening.json`'s record of one batch: its verdict, why, and every pair worst first."""
    pairs = [
        _pair_record(
            entry,
            counts,
            _pair_verdict(entry, counts, position, decision=decision, calibration=calibration, rule=rule),
        )
        | {
            "contradicted": judgement is not None and position in judgement.contradicted,
            "confusion": top_confusion(counts, calibration, classes),
            "excess": round(counts.excess(calibration.usual), 4),
        }
        for position, (entry, counts) in enumerate(screened)
    ]
    if decision.held:
        # An outvoted batch's pairs the judging model trained on are held too (it never judged them).
        listed = {p["image"] for p in pairs}
        pairs += [_pair_record(e, None, "held") for e in members if e.trust == NEW and e.image not in listed]
    pairs.sort(key=lambda p: (-p["excess"], p["quality"]))
    return {
        "team": team_of(members[0]),
        "pair_count": len(screened),
        "judged": judgement.judged if judgement else 0,
        "contradicted": len(judgement.contradicted) if judgement else 0,
        "share": round(judgement.contradicted_share, 4) if judgement else 0.0,
        "verdict": decision.verdict,
        "held": decision.held,
        "independent": decision.independent,
        "findings": [f.to_json() for f in judgement.findings] if judgement else [],
        "reasons": decision.reasons,
        "pairs": pairs,
    }


def _pair_verdict(
    entry: Entry, counts: PairCounts, position: int, *, decision: Decision, calibration: Calibration, rule: Rule
) -> str:
    if entry.trust == RELEASED:
        return "released"  # a person's decision stands: judged and reported, never held again
    if decision.held:
        return "held"
    if position in decision.left_out:
        return "left out"
    return "passed" if calibration.pair_is_judged(counts, rule) else "not judged"


def _pair_record(entry: Entry, counts: PairCounts | None, verdict: str) -> dict[str, Any]:
    """One pair in `screening.json`: its content, verdict and what the judge made of it (`counts`
    None: the judging model learned it, so it did not judge it)."""
    return {
        "image": entry.image,
        "label": entry.label,
        "image_sha256": entry.image_sha256,
        "label_sha256": entry.label_sha256,
        "split": entry.split,
        "trust": entry.trust,
        "verdict": verdict,
        "contradicted": False,
        "excess": 0.0,
        "coverage": round(counts.coverage, 4) if counts else 0.0,
        "familiar": counts.familiar if counts else True,
        "quality": round(counts.quality, 4) if counts else 1.0,
        "confusion": "" if counts else "the judging model learned it: not judged by it",
    }


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
        help="with an accepted model, judge every new pair first; leave out or hold what it contradicts",
    )
    rule = Rule()
    # The rule's settings a deployment may tune, each from `Rule`'s default.
    for flag, default, meaning in (
        (
            "--screen-batch-margin",
            rule.batch_margin,
            "hold a batch when this share of its judged pairs is contradicted",
        ),
        (
            "--screen-class-margin",
            rule.class_margin,
            "hold a batch that labels a class otherwise this much beyond usual",
        ),
        (
            "--screen-pair-margin",
            rule.pair_margin,
            "the least share of a pair's pixels beyond usual that contradicts it",
        ),
        ("--screen-competence", rule.competence, "judge a class only where the calibration IoU reaches this"),
    ):
        group.add_argument(flag, type=float, default=default, help=meaning)
    group.add_argument("--screening-scale", type=float, default=Settings.scale, help="the scale the model screens at")
    group.add_argument(
        "--held-pair-pictures",
        choices=pictures.PICTURE_MODES,
        default=Settings.picture_mode,
        help="pictures of the pairs to fix show faces and number plates: blur them (default), show them, or omit them",
    )


def settings_of(args: argparse.Namespace, context: distributed.Context) -> Settings:
    rule = Rule(
        competence=args.screen_competence,
        pair_margin=args.screen_pair_margin,
        batch_margin=args.screen_batch_margin,
        class_margin=args.screen_class_margin,
    )
    # The loader's workers decode for screening as they do for training (build.loaders' count).
    cuda = context.device.type == "cuda"
    workers = args.workers if args.workers >= 0 else default_workers(context.local_world_size, accelerator=cuda)
    return Settings(rule=rule, scale=args.screening_scale, workers=workers, picture_mode=args.held_pair_pictures)


def load_model(path: str, classes: list[str], device: torch.device) -> tuple[nn.Module, Basis]:
    """The accepted model and what it learned from, for screening and the comparison."""
    document = checkpoint.load_model_document(Path(path))
    if document["classes"] != classes:
        raise SystemExit(f"the accepted model {path} predicts other classes than this run")
    model = BiSeNetV2(len(classes), width=document["width"], aux=False).to(device)
    model.load_state_dict(document["state_dict"])
    model.source = path  # type: ignore[assignment]  # named in the logs and metrics.json
    return model.eval(), Basis.from_document(document)


def before_training(
    args: argparse.Namespace, context: distributed.Context, classes: list[str], manifest: Path
) -> tuple[nn.Module | None, Screening | None]:
    """The accepted model (if the job has one) and what screening the version with it found."""
    path = build_baseline(args)
    if path is None:
        log.info("label screening: no accepted model yet, so nothing to screen with; every pair is trained on")
        return None, None
    model, basis = load_model(path, classes, context.device)
    return model, phase(args, context, model, basis, model_name=path, classes=classes, manifest=manifest)


def phase(
    args: argparse.Namespace,
    context: distributed.Context,
    model: nn.Module,
    basis: Basis,
    *,
    model_name: str,
    classes: list[str],
    manifest: Path,
) -> Screening | None:
    """Screen the version's new and released pairs; rank 0 writes `screening.json` and the
    pictures beside `metrics.json`. None when screening is off or nothing is new."""
    if not args.screen_labels:
        log.info("label screening is off (--screen-labels false): every pair is trained on")
        return None
    entries = read_manifest(manifest)
    if not any(entry.trust in SCREENED for entry in entries):
        log.info("label screening: no new or released pair in this version")
        return None
    base_size = parse_size(args.base_size) if args.base_size else None
    dataset = SegmentationDataset(
        Path(args.data_dir), entries, None, base_size, ImageDecoder(pick_decoder(args.decoder))
    )
    settings = settings_of(args, context)
    screener = Screener(model, context.device, settings.scale, settings.batch_size, settings.workers)
    screening = screen_version(screener, dataset, entries, classes, settings, model_name=model_name, basis=basis)
    if context.is_main:
        output = Path(args.output_data_dir)
        pictures.write(
            screener.probabilities,
            dataset,
            entries,
            screening.batches,
            screening.calibration,
            folder=output / "screening",
            per_batch=settings.pictures,
            mode=settings.picture_mode,
        )
        output.mkdir(parents=True, exist_ok=True)
        (output / "screening.json").write_text(json.dumps(screening.to_json(), indent=2), encoding="utf-8")
    _log(screening)
    return screening


def _log(screening: Screening) -> None:
    log.info(
        "label screening (%.1f s): calibrated on %d pairs, %s; %d batches",
        screening.seconds,
        screening.calibration.pairs,
        screening.calibration_kind,
        len(screening.batches),
    )
    for name, batch in screening.batches.items():
        log.info(
            "  %s: %d pairs, %d judged, %d contradicted: %s",
            name,
            batch["pair_count"],
            batch["judged"],
            batch["contradicted"],
            batch["verdict"].upper() if batch["held"] else batch["verdict"],
        )
        if batch["verdict"] != "ok":
            for reason in batch["reasons"]:
                log.info("    %s", reason)


def summary(screening: Screening | None, have_model: bool) -> dict[str, Any]:
    """What `metrics.json` says of the screening; the details are in `screening.json`."""
    if screening is None:
        why = "screening was off or no pair was new" if have_model else "no accepted model yet: nothing to screen with"
        return {"screened": False, "why": why, "held": []}
    return {
        "screened": True,
        "file": "screening.json",
        "pictures": screening.picture_mode,
        "calibration": screening.calibration_kind,
        "calibration_text": screening.calibration_text,
        "held": screening.held,
        "disputed": screening.decisions.disputed,
        "left_out": len(screening.left_out),
        "verdicts": summary_counts(screening.decisions.batches),
        "batches": {
            name: {k: batch[k] for k in ("team", "pair_count", "judged", "contradicted", "verdict", "held")}
            for name, batch in screening.batches.items()
        },
    }
