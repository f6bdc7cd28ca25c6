"""Resumable checkpoints and the model file: written atomically, loaded without unpickling code.

A checkpoint holds everything a restarted job (a spot interruption) needs to continue as if it had
never stopped: model, optimizer, scheduler, scaler, epoch and step within the epoch (hence the
sampler position), the epoch history so far, and every rank's RNG state. SageMaker syncs the
checkpoint folder to S3 while the job runs and restores it on restart; files are written beside
their final name and renamed, so neither a reader nor that sync ever sees half a checkpoint.

Everything saved is plain tensors, numbers, strings and containers, so both files load with
`torch.load(weights_only=True)`: a model or checkpoint from S3 cannot run code on load.

`Checkpointer` decides when one is due and writes it; `resume` reads one back into a `RunState`.
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from trainer import distributed, schedule, stopping, warm_start
from trainer.data import EpochLayout
from trainer.metrics import EpochProgress

if TYPE_CHECKING:
    import argparse

log = logging.getLogger("trainer")

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d{9})\.pt$")
MODEL_FORMAT = "retrain-bisenetv2"
MODEL_FILE = warm_start.MODEL_FILE


def checkpoint_path(directory: Path, global_step: int) -> Path:
    return directory / f"checkpoint-{global_step:09d}.pt"


def newest(directory: Path) -> Path | None:
    """The checkpoint with the highest global step; partial files never match the pattern."""
    if not directory.is_dir():
        return None
    found = [
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := CHECKPOINT_NAME.match(path.name)) is not None
    ]
    return max(found)[1] if found else None


def save_atomically(document: dict[str, Any], path: Path) -> None:
    """torch.save to a partial file, flush it to disk, then rename over the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as handle:
        torch.save(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)


def save_checkpoint(document: dict[str, Any], directory: Path, global_step: int, keep: int) -> Path:
    """Write a checkpoint and keep only the newest `keep` (disk and S3 sync time are not free)."""
    path = checkpoint_path(directory, global_step)
    save_atomically(document, path)
    older = sorted(
        (int(match.group(1)), candidate)
        for candidate in directory.iterdir()
        if (match := CHECKPOINT_NAME.match(candidate.name)) is not None
    )
    for _, stale in older[: max(0, len(older) - keep)]:
        stale.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    return _load(path, path)


def _load(source: Path | io.BytesIO, path: Path) -> dict[str, Any]:
    document = torch.load(source, map_location="cpu", weights_only=True)
    if not isinstance(document, dict):
        raise TypeError(f"{path} does not hold a dictionary")
    return document


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and current GPU), in loadable types."""
    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)
    return {
        "python": [version, list(internal), gauss],
        "numpy": {
            "keys": torch.from_numpy(np.asarray(legacy[1], dtype=np.int64)),
            "pos": int(legacy[2]),
            "has_gauss": int(legacy[3]),
            "cached_gaussian": float(legacy[4]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def model_document(
    state_dict: dict[str, torch.Tensor], *, width: float, classes: list[str], basis: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The model file: inference weights (no booster heads), what it takes to rebuild the net, and
    what it learned from (`basis`: teams, batches and pair keys; screening/phase.py reads it)."""
    return {
        "format": MODEL_FORMAT,
        "version": 1,
        "architecture": "bisenetv2",
        "width": width,
        "classes": list(classes),
        "state_dict": {k: v for k, v in state_dict.items() if not k.startswith("aux_heads.")},
        **({"basis": basis} if basis is not None else {}),
    }


def load_model_document(path: Path) -> dict[str, Any]:
    """A model file written by `model_document`, checked to be one; `path` may also be a
    model.tar.gz holding it, as SageMaker packs a job's model folder."""
    document = _load(warm_start.model_source(path), path)
    if document.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path} is not a {MODEL_FORMAT} model file (format {document.get('format')!r})")
    return document


def load_weights(model: nn.Module, path: Path, width: float, classes: list[str]) -> None:
    """Start `model` from a model file of the same width and classes."""
    document = load_model_document(path)
    if document["width"] != width or document["classes"] != classes:
        raise SystemExit(
            f"{path} is width {document['width']} with {len(document['classes'])} classes; this "
            f"run is width {width} with {len(classes)}: pass --from-scratch or matching flags"
        )
    # The model file carries no booster heads; they start fresh.
    missing, unexpected = model.load_state_dict(document["state_dict"], strict=False)
    if unexpected or any(not key.startswith("aux_heads.") for key in missing):
        raise SystemExit(f"{path} does not fit BiSeNetV2: missing {missing}, unexpected {unexpected}")


@dataclass
class RunState:
    """Where training stands: what a checkpoint restores."""

    epoch: int = 0
    step_in_epoch: int = 0
    # Samples of this epoch's global order that all ranks together have trained on: the sampler
    # position, in a unit that does not depend on the world size (see data.EpochLayout).
    epoch_position: int = 0
    # Optimizer steps taken over the whole run, whatever world size took them: it only grows, so
    # the newest checkpoint is the one with the highest.
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] | None = None
    progress: EpochProgress = field(default_factory=EpochProgress)
    init_from: str | None = None
    warm_start: dict[str, Any] | None = None
    resumed_from: str | None = None


@dataclass(frozen=True)
class StepDecision:
    """What every rank does after an optimizer step, decided alike on all of them."""

    save: bool
    stop: bool


class Checkpointer:
    """Decides when a checkpoint is due; writes it from rank 0 with every rank's RNG state."""

    def __init__(self, args: argparse.Namespace, context: distributed.Context, dataset_version: str) -> None:
        self.args = args
        self.context = context
        self.dataset_version = dataset_version
        self.last_saved = time.monotonic()

    def decide(self, global_step: int, *, stop_requested: bool) -> StepDecision:
        """After every optimizer step, on every rank: save now? stop now (after saving)?

        One all-reduce of two flags per step, whatever the settings: ranks that disagreed would
        wait forever in the collectives inside save(). The clock is rank 0's alone (clocks differ
        between hosts; the others vote no), a stop is any rank's (SIGTERM reaches the hosts at
        different moments), so every rank stops at the same step.
        """
        every_steps, every_seconds = (
            self.args.checkpoint_every_steps,
            self.args.checkpoint_every_seconds,
        )
        late = bool(every_seconds) and self.context.is_main and time.monotonic() - self.last_saved >= every_seconds
        late, stop = distributed.any_rank([late, stop_requested], self.context.device)
        on_schedule = bool(every_steps) and global_step % every_steps == 0
        return StepDecision(save=on_schedule or late or stop, stop=stop)

    def save(
        self,
        state: RunState,
        global_step: int,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: Any,
    ) -> Path | None:
        """Every rank calls it; rank 0 writes, and alone gets the path back."""
        # Every rank's RNG state and running sums, so each resumed rank continues its own streams.
        rng_states = distributed.gather_objects(rng_state())
        progress_states = distributed.gather_objects(asdict(state.progress))
        self.last_saved = time.monotonic()
        if not self.context.is_main:
            return None
        document = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "epoch": state.epoch,
            "step_in_epoch": state.step_in_epoch,
            "epoch_position": state.epoch_position,
            "global_step": global_step,
            "world_size": self.context.world_size,
            "step_samples": self.args.batch_size * self.args.grad_accum * self.context.world_size,
            "dataset_version": self.dataset_version,
            "init_from": state.init_from,
            "warm_start": state.warm_start,
            "history": state.history,
            "baseline": state.baseline,
            "progress": progress_states,
            "rng": rng_states,
        }
        directory = Path(self.args.checkpoint_dir)
        path = save_checkpoint(document, directory, global_step, self.args.keep_checkpoints)
        log.info(
            "checkpoint %s (epoch %d, step %d, sample %d of the epoch)",
            path.name,
            state.epoch + 1,
            state.step_in_epoch,
            state.epoch_position,
        )
        return path


class AfterStep:
    """Called after every optimizer step: a checkpoint if one is due or a stop was asked for
    (then every rank leaves, at this same step), and the test hook's kill."""

    def __init__(
        self,
        saver: Checkpointer,
        state: RunState,
        layout: EpochLayout,
        stop: stopping.StopRequest,
        stop_after_steps: int,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: Any,
    ) -> None:
        self.saver, self.state, self.layout, self.stop = saver, state, layout, stop
        self.stop_after_steps = stop_after_steps
        self.parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        # Where this epoch began, in samples of its global order and in this job's steps: a
        # resumed epoch starts part-way (under another world size, at a position no step reached).
        self.epoch_position, self.epoch_step = 0, 0

    def epoch_started(self, position: int, step: int) -> None:
        self.epoch_position, self.epoch_step = position, step

    def __call__(self, step_in_epoch: int, global_step: int, progress: EpochProgress) -> None:
        decision = self.saver.decide(global_step, stop_requested=self.stop.requested)
        if decision.save:
            state = self.state
            state.step_in_epoch, state.progress, state.global_step = step_in_epoch, progress, global_step
            done = (step_in_epoch - self.epoch_step) * self.layout.step_samples
            state.epoch_position = self.epoch_position + done
            self.saver.save(state, global_step, **self.parts)
        if decision.stop:
            raise stopping.Interrupted(global_step, self.stop.name)
        if self.stop_after_steps and global_step >= self.stop_after_steps:
            # Die as a reclaimed spot instance does: at once, with no cleanup and no final save.
            log.warning("killing this process after %d steps (--stop-after-steps)", global_step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


def resume(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: Any,
    *,
    dataset_version: str,
    context: distributed.Context,
    layout: EpochLayout,
) -> RunState:
    """Restore a checkpoint into the objects given, on every rank; where training then stands.

    A checkpoint written by another world size (or batch) continues at the same sample of the
    same epoch: the sampler re-shards the rest of the epoch over this job's ranks
    (`data.ResumableDistributedSampler`), the learning-rate schedule is this job's, moved to the
    same point of the run, and the running sums and RNG streams are spread over the new ranks.
    """
    document = load(path)
    if document["dataset_version"] != dataset_version:
        raise SystemExit(
            f"{path} is a checkpoint of dataset {document['dataset_version']}, not "
            f"{dataset_version}: give every job its own checkpoint folder"
        )
    written_by = int(document["world_size"])
    # Checkpoints from before positions were recorded came from a job of this batch size.
    step_samples = int(document.get("step_samples", layout.rank_batch * written_by))
    position = int(document.get("epoch_position", document["step_in_epoch"] * step_samples))
    same_layout = written_by == context.world_size and step_samples == layout.step_samples
    model.load_state_dict(document["model"])
    optimizer.load_state_dict(document["optimizer"])
    if same_layout:
        scheduler.load_state_dict(document["scheduler"])
    else:
        # The saved schedule counted the other job's steps; this job's continues at the same point.
        schedule.move_to(scheduler, document["epoch"] * layout.steps + layout.first_step(position))
    if scaler is not None and document["scaler"] is not None:
        scaler.load_state_dict(document["scaler"])
    progress = (
        EpochProgress(**document["progress"][context.rank])
        if same_layout
        else merge_progress(document["progress"], context.rank)
    )
    # Last, so that nothing above draws from the restored streams. A rank the writer did not have
    # keeps the stream it was seeded with.
    if context.rank < len(document["rng"]):
        set_rng_state(document["rng"][context.rank])
    _log_resume(path, document, layout, position, written_by)
    return RunState(
        epoch=document["epoch"],
        step_in_epoch=layout.first_step(position),
        epoch_position=position,
        global_step=document["global_step"],
        history=document["history"],
        baseline=document["baseline"],
        progress=progress,
        init_from=document["init_from"],
        warm_start=document.get("warm_start"),
        resumed_from=str(path),
    )


def merge_progress(saved: list[dict[str, Any]], rank: int) -> EpochProgress:
    """This rank's share of an interrupted epoch's running sums, written by another world size.

    Counts (loss, micro-batches, images) are summed over the ranks that wrote them and held by
    rank 0 alone, so the epoch's totals survive the all-reduce at its end; times are the mean
    rank's, held by every rank: ranks step in lock-step, so the mean is the time the epoch took.
    """
    ranks = [EpochProgress(**fields) for fields in saved]
    merged: dict[str, Any] = {}
    for item in dataclass_fields(EpochProgress):
        values = [getattr(progress, item.name) for progress in ranks]
        if item.name.endswith("_seconds"):
            merged[item.name] = sum(values) / len(values)
        else:
            merged[item.name] = sum(values) if rank == 0 else 0
    return EpochProgress(**merged)


def _log_resume(path: Path, document: dict[str, Any], layout: EpochLayout, position: int, written_by: int) -> None:
    epoch, first_step = document["epoch"] + 1, layout.first_step(position)
    if written_by == layout.world_size and position == first_step * layout.step_samples:
        log.info("resumed from %s: epoch %d, step %d", path, epoch, first_step)
        return
    log.info(
        "resumed from %s, written by %d processes: epoch %d from sample %d of %d, the rest of it "
        "re-sharded over %d processes (step %d of %d of this job's epoch)",
        path,
        written_by,
        epoch,
        min(position, layout.samples),
        layout.samples,
        layout.world_size,
        first_step,
        layout.steps,
    )
