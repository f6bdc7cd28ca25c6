"""A run, set up before its first step: what `train.py`'s epochs train with and its end reports.

`set_up` goes in this order, the one the run has always had (the random draws of datasets and
model follow the seeding, and a resume overwrites what was built): seed the ranks; screen the
version's new pairs and load both splits (`RunData`); build the model, the optimiser and the loss
(`Optimisation`); resume from the newest checkpoint; score the accepted model on the val split;
describe the run's lineage and start the profiler. Its parts come from `build.py`, `checkpoint.py`,
`screening/` and `profiling/`; this file only puts them together.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import build, checkpoint, distributed, lineage, stopping, timing
from trainer.checkpoint import Checkpointer, RunState
from trainer.data import EpochLayout, ResumableDistributedSampler, SegmentationDataset, class_weights
from trainer.metrics import metric_line
from trainer.model import SegmentationLoss
from trainer.profiling import flags as profiling_flags
from trainer.profiling.session import Profiler
from trainer.screening import phase as screening_phase
from trainer.screening import scores

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class RunData:
    """The version's pairs, screened, split and loaded, and an epoch laid out in optimizer steps."""

    classes: list[str]
    dataset_version: str
    # The accepted model, when the job has one, and what screening the new pairs with it found.
    accepted: nn.Module | None
    screening: screening_phase.Screening | None
    train_set: SegmentationDataset
    val_set: SegmentationDataset
    train_sampler: ResumableDistributedSampler
    train_loader: DataLoader[Any]
    val_loader: DataLoader[Any]
    layout: EpochLayout


@dataclass(frozen=True)
class Optimisation:
    """The model and what trains it."""

    # The bare module evaluates, checkpoints and is saved; `model` is it DDP-wrapped when distributed.
    bare_model: nn.Module
    model: nn.Module
    channels_last: bool
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: Any  # a GradScaler for fp16, else None
    amp_dtype: torch.dtype | None
    criterion: SegmentationLoss
    comm_timer: timing.AllReduceTimer | None


@dataclass
class Run:
    """The run once set up (and resumed); `state` is what every epoch advances and checkpoints."""

    args: argparse.Namespace
    context: distributed.Context
    data: RunData
    optim: Optimisation
    state: RunState
    # What metrics.json says of the run besides its epochs (`lineage.describe`, then the results).
    lineage_info: dict[str, Any]
    saver: Checkpointer
    profiler: Profiler
    # After every optimizer step: a checkpoint if one is due or a stop was asked for.
    after_step: checkpoint.AfterStep

    @property
    def metrics_folders(self) -> tuple[str, str]:
        # metrics.json goes to the output folder and beside the model.
        return (self.args.output_data_dir, self.args.model_dir)


def set_up(args: argparse.Namespace, context: distributed.Context, threads: contextlib.ExitStack) -> Run:
    """Everything before the first step; the profiler's threads are closed with `threads`."""
    build.check_args(args)
    _seed(args, context)
    data = _data(args, context)
    start = build.warm_start_of(args)
    # Said whichever way it goes: a run that silently started from scratch looks like a bad run.
    log.info("%s", start.describe())
    state = RunState(init_from=str(start.path) if start.path else None, warm_start=start.lineage())
    optim = _optimisation(args, context, data, state.init_from)
    state = _resume(args, context, data, optim, state)
    if data.accepted is not None and state.baseline is None:
        # The accepted model on this run's validation pairs, per batch: the two compare on the same images.
        batch_size = args.val_batch_size or args.batch_size
        state.baseline = scores.baseline(data.accepted, data.val_set, data.classes, context.device, batch_size)
        if context.is_main:
            print(metric_line(baseline_miou=state.baseline["miou"]), flush=True)

    lineage_info = lineage.describe(
        args,
        context,
        data.dataset_version,
        data.classes,
        train_set=data.train_set,
        val_set=data.val_set,
        loader=data.train_loader,
        state=state,
    )
    saver = Checkpointer(args, context, data.dataset_version)
    profiler = profiling_flags.make_profiler(args, context, lineage_info["loader"]).start()
    threads.callback(profiler.close)
    _log_run(args, context, data, optim)
    after_step = checkpoint.AfterStep(
        saver,
        state,
        data.layout,
        stopping.StopRequest().install(),
        args.stop_after_steps,
        model=optim.bare_model,
        optimizer=optim.optimizer,
        scheduler=optim.scheduler,
        scaler=optim.scaler,
    )
    return Run(
        args=args,
        context=context,
        data=data,
        optim=optim,
        state=state,
        lineage_info=lineage_info,
        saver=saver,
        profiler=profiler,
        after_step=after_step,
    )


def _seed(args: argparse.Namespace, context: distributed.Context) -> None:
    # Ranks draw different dropout noise, like independent replicas would; the weights still start
    # equal, because DDP broadcasts rank 0's at construction.
    random.seed(args.seed + context.rank)
    np.random.seed(args.seed + context.rank)
    torch.manual_seed(args.seed + context.rank)
    if context.device.type == "cuda":
        torch.backends.cudnn.benchmark = not args.deterministic
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def _data(args: argparse.Namespace, context: distributed.Context) -> RunData:
    """The manifest is the dataset, nothing is listed."""
    manifest = build.manifest_path(args)
    dataset_version = args.dataset_version or manifest.stem
    classes = [name.strip() for name in args.classes.split(",")]
    # Screening: the accepted model judges every new pair's labels before they are trained on;
    # held batches and the pairs left out for their team to fix are in neither split.
    accepted, screening = screening_phase.before_training(args, context, classes, manifest)
    train_set, val_set = build.datasets(args, manifest, left_out=screening.left_out if screening else ())
    train_sampler, train_loader, val_loader = build.loaders(args, context, train_set, val_set)
    layout = EpochLayout(len(train_set), context.world_size, args.batch_size * args.grad_accum)
    if layout.steps < 1:
        raise SystemExit(
            f"{len(train_sampler)} training images per process cannot fill one step of "
            f"{args.batch_size} x {args.grad_accum}: lower --batch-size or --grad-accum"
        )
    return RunData(
        classes=classes,
        dataset_version=dataset_version,
        accepted=accepted,
        screening=screening,
        train_set=train_set,
        val_set=val_set,
        train_sampler=train_sampler,
        train_loader=train_loader,
        val_loader=val_loader,
        layout=layout,
    )


def _optimisation(
    args: argparse.Namespace, context: distributed.Context, data: RunData, init_from: str | None
) -> Optimisation:
    device = context.device
    bare_model, model, channels_last = build.models(args, context, data.classes, init_from)
    # Wraps DDP's own all-reduce, so gradients are averaged exactly as without it.
    comm_timer = timing.attach_timer(model, device) if args.time_communication else None
    optimizer, scheduler, scaler, amp_dtype = build.optimization(args, model, data.layout.steps, device)
    balanced = args.class_weighting == "balanced"
    weights = class_weights(data.train_set.entries, len(data.classes)) if balanced else None
    criterion = SegmentationLoss(args.aux_weight, weights).to(device)
    return Optimisation(
        bare_model=bare_model,
        model=model,
        channels_last=channels_last,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        amp_dtype=amp_dtype,
        criterion=criterion,
        comm_timer=comm_timer,
    )


def _resume(
    args: argparse.Namespace, context: distributed.Context, data: RunData, optim: Optimisation, fresh: RunState
) -> RunState:
    """A restarted job (a spot interruption) continues from the newest checkpoint: its state, with
    model, optimiser, scheduler and scaler loaded in place; `fresh` when there is none."""
    newest = checkpoint.newest(Path(args.checkpoint_dir)) if context.is_main else None
    # Every rank must resume at the same step or their collectives would not line up: rank 0
    # chooses, and each rank reads that file from its own copy of the folder (SageMaker restores
    # the checkpoint prefix onto every host).
    newest_name = distributed.broadcast_object(newest.name if newest else None)
    if newest_name is None:
        return fresh
    return checkpoint.resume(
        Path(args.checkpoint_dir) / newest_name,
        optim.bare_model,
        optim.optimizer,
        optim.scheduler,
        optim.scaler,
        dataset_version=data.dataset_version,
        context=context,
        layout=data.layout,
    )


def _log_run(args: argparse.Namespace, context: distributed.Context, data: RunData, optim: Optimisation) -> None:
    log.info(
        "dataset %s: %d train, %d val; %d steps/epoch x %d epochs; %d x %s (%s); BiSeNetV2 width %g, %d parameters",
        data.dataset_version,
        len(data.train_set),
        len(data.val_set),
        data.layout.steps,
        args.epochs,
        context.world_size,
        context.device.type,
        context.backend,
        args.width,
        sum(p.numel() for p in optim.bare_model.parameters()),
    )
