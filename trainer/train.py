"""Train BiSeNetV2 on a frozen dataset version, data-parallel, under the SageMaker contract.

SageMaker runs this file (script mode, `source_dir=trainer/`) under torchrun, one process per
GPU; locally the same command runs on CPU with gloo:

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m trainer.train \
        --data-dir runs/scenes --manifest manifests/synth-128x64-n320-s0.jsonl \
        --model-dir runs/train/model --output-data-dir runs/train/output \
        --checkpoint-dir runs/train/checkpoints --width 0.25 --crop 128x64 --epochs 20

(`retrain train DATA_DIR` wraps exactly that.) The container contract: images, labels and
`manifests/<version>.jsonl` from `SM_CHANNEL_TRAIN`; the model to `SM_MODEL_DIR`; `metrics.json`
to `SM_OUTPUT_DATA_DIR` (and beside the model); checkpoints to `/opt/ml/checkpoints`, which
SageMaker syncs to S3 and restores on restart; hyperparameters as `--name value` flags; rank and
world size from torchrun's environment. Rank 0 alone logs, prints one `METRIC ...` line per epoch
for SageMaker's MetricDefinitions, and writes files. Batches come from loader workers laid out per
host (`loader.py`: decoding never happens in this process on a GPU host); every step is split into
data wait, compute and exposed all-reduce, per rank (`timing.py`). With `--profiling builtin` (the
default) every step also lands in `profile/steps/rank<r>.jsonl`, one sampler per host writes
`profile/system/<host>.jsonl`, and at the end rank 0 writes `rules.json` and `report.html` beside
`metrics.json` (`profiling/`); a rule named in `--stop-on-rule` stops every rank cleanly.

This file is the run, top to bottom: `train` (set up, the epochs, the finish), `train_one_epoch`,
`evaluate`. Beside it, `flags.py` holds the flags (`get_args_parser`), `run_setup.py` sets the run
up before its first step, `build.py` turns the flags into datasets, loaders, model and optimiser,
`checkpoint.py` saves and resumes the run, and `metrics.py` sums each epoch up into `metrics.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import logging
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:
    # SageMaker runs `train.py` as a script from source_dir (/opt/ml/code), where its siblings are
    # not a package: register that folder as the `trainer` package the imports below expect.
    _here = Path(__file__).resolve().parent
    _spec = importlib.util.spec_from_file_location(
        "trainer", _here / "__init__.py", submodule_search_locations=[str(_here)]
    )
    assert _spec is not None and _spec.loader is not None
    sys.modules["trainer"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["trainer"])

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from trainer import (
    checkpoint,
    checksums,
    distributed,
    metrics,
    precision,
    run_setup,
    stopping,
    timing,
)
from trainer.data import to_device
from trainer.flags import get_args_parser  # the entry point's; tests import it from here too
from trainer.metrics import ConfusionMatrix, EpochProgress
from trainer.model import SegmentationLoss
from trainer.profiling.session import Profiler
from trainer.screening import phase as screening_phase
from trainer.screening import scores

log = logging.getLogger("trainer")


def main(args: argparse.Namespace) -> None:
    context = distributed.setup(args.backend)
    logging.basicConfig(
        # Rank 0 alone tells the story; other ranks speak up only when something is wrong.
        level=logging.INFO if context.is_main else logging.WARNING,
        format=f"%(asctime)s rank{context.rank} %(levelname)s %(message)s",
        stream=sys.stdout,
        force=True,
    )
    try:
        # The run's threads (the profiler's sampler and rule thread) stop and are joined when
        # the run ends, however it ends, and before the process group goes.
        with contextlib.ExitStack() as threads:
            train(args, context, threads)
    except BaseException as error:
        # A failed or stopped run's frames still hold its DDP model, and the model holds the
        # process group: drop their locals, so that cleanup() can free the group.
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        distributed.cleanup()


# Like torchvision's reference, the run reads top to bottom: set up, the epochs, the finish.
def train(args: argparse.Namespace, context: distributed.Context, threads: contextlib.ExitStack) -> None:
    """The whole run on this rank: `run_setup.set_up`, then every epoch left, then `_finish`."""
    run = run_setup.set_up(args, context, threads)
    loop = _epoch_context(run)
    state, profiler = run.state, run.profiler
    global_step = state.global_step
    for epoch in range(state.epoch, args.epochs):
        epoch_started = time.perf_counter()
        progress, first_step = _begin_epoch(run, epoch)
        # Training time spent in this epoch before an interruption, so epoch_seconds is whole.
        seconds_before = progress.train_seconds
        global_step = _train_or_stop(
            run, loop, epoch, first_step=first_step, global_step=global_step, progress=progress
        )
        totals = metrics.reduce_progress(progress, context.device, context.world_size)
        # Every rank learnt the same verdict in the same step (a broadcast from rank 0).
        stopped_by = profiler.stopped_by
        if (epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs or stopped_by:
            _evaluate_epoch(
                run, epoch, totals, started=epoch_started, seconds_before=seconds_before, stopped_by=stopped_by
            )
        # An epoch-end checkpoint too: a restart never redoes a finished epoch or its evaluation.
        state.epoch, state.step_in_epoch, state.progress = epoch + 1, 0, EpochProgress()
        state.epoch_position, state.global_step = 0, global_step
        _save(run, global_step)
        if stopped_by:
            log.warning("rule %s stopped the run after epoch %d (--stop-on-rule)", stopped_by, epoch + 1)
            break
    _finish(run)


def _epoch_context(run: run_setup.Run) -> EpochContext:
    optim = run.optim
    return EpochContext(
        model=optim.model,
        criterion=optim.criterion,
        optimizer=optim.optimizer,
        scheduler=optim.scheduler,
        scaler=optim.scaler,
        device=run.context.device,
        data_loader=run.data.train_loader,
        steps=run.data.layout.steps,
        epochs=run.args.epochs,
        grad_accum=run.args.grad_accum,
        log_every=run.args.log_every,
        amp_dtype=optim.amp_dtype,
        channels_last=optim.channels_last,
        on_step=run.after_step,
        comm_timer=optim.comm_timer,
        profiler=run.profiler,
    )


def _begin_epoch(run: run_setup.Run, epoch: int) -> tuple[EpochProgress, int]:
    """The epoch's progress so far and its first step, with the sampler placed there."""
    state, sampler = run.state, run.data.train_sampler
    # Without set_epoch every epoch would shuffle into the same order.
    sampler.set_epoch(epoch)
    # Resuming mid-epoch: the samples all ranks had consumed are left out, the rest of the
    # epoch is dealt over this job's ranks (re-sharded, if the world size changed).
    position = state.epoch_position if epoch == state.epoch else 0
    sampler.resume_at(position)
    first_step = run.data.layout.first_step(position)
    run.after_step.epoch_started(position, first_step)
    return (state.progress if position else EpochProgress()), first_step


def _train_or_stop(
    run: run_setup.Run, loop: EpochContext, epoch: int, *, first_step: int, global_step: int, progress: EpochProgress
) -> int:
    """`train_one_epoch`; an interruption (checkpointed by then) exits the process instead."""
    try:
        return train_one_epoch(loop, epoch, first_step=first_step, global_step=global_step, progress=progress)
    except stopping.Interrupted as stopped:
        # Every rank is here, after the same step; rank 0 may still be writing the checkpoint.
        distributed.barrier()
        log.warning(
            "%s: checkpointed after step %d (epoch %d) and stopping; the job resumes from %s",
            stopped,
            stopped.global_step,
            epoch + 1,
            run.args.checkpoint_dir,
        )
        logging.shutdown()
        raise SystemExit(stopping.EXIT_CODE) from None


def _evaluate_epoch(
    run: run_setup.Run,
    epoch: int,
    totals: dict[str, Any],
    *,
    started: float,
    seconds_before: float,
    stopped_by: str | None,
) -> None:
    """The epoch's evaluation, its record in the history and metrics.json, and the checksums so far."""
    args, context, data, optim = run.args, run.context, run.data, run.optim
    # The bare module: DDP's forward may broadcast buffers, a collective that would hang
    # when the val shards differ in length.
    confusion = evaluate(
        optim.bare_model,
        data.val_loader,
        context.device,
        len(data.classes),
        amp_dtype=optim.amp_dtype,
        channels_last=optim.channels_last,
        profiler=run.profiler,
        epoch=epoch,
    )
    record = metrics.epoch_record(
        epoch, totals, optim.optimizer, confusion, classes=data.classes, steps=data.layout.steps
    )
    record["epoch_seconds"] = round(time.perf_counter() - started + seconds_before, 3)
    run.state.history.append(record)
    # Every rank: the files read so far against the manifest's pins, ORed over the ranks.
    pins = checksums.collect_splits(
        {"train": data.train_set, "val": data.val_set}, context.device, args.max_checksum_mismatch_fraction
    )
    if pins is not None:
        run.lineage_info["checksums"] = pins.report()
    if context.is_main:
        print(metrics.epoch_metric_line(record), flush=True)
        if stopped_by:
            run.lineage_info["stopped_by_rule"] = stopped_by
        state = run.state
        metrics.write_metrics(run.metrics_folders, run.lineage_info, state.history, state.baseline, complete=False)
    if pins is not None:
        # Above the tolerance, every rank fails here, once metrics.json names the files.
        checksums.enforce(pins, is_main=context.is_main)


def _save(run: run_setup.Run, global_step: int) -> None:
    optim = run.optim
    run.saver.save(
        run.state,
        global_step,
        model=optim.bare_model,
        optimizer=optim.optimizer,
        scheduler=optim.scheduler,
        scaler=optim.scaler,
    )


def _finish(run: run_setup.Run) -> None:
    """After the last epoch: the candidate against the accepted model, the model file and the
    final metrics.json (rank 0), the profiling report, then every rank together."""
    args, context, data, bare_model = run.args, run.context, run.data, run.optim.bare_model
    # The candidate against the accepted model, per batch and on the trusted set (every rank).
    candidate = scores.confusion_by_batch(
        bare_model, data.val_set, len(data.classes), context.device, batch_size=args.val_batch_size or args.batch_size
    )
    held, accepted_by_batch = (data.screening.held if data.screening else []), scores.from_lists(run.state.baseline)
    run.lineage_info["evaluation"] = scores.evaluation(
        data.classes, data.val_set.entries, candidate, accepted_by_batch, held=held, trained=data.train_set.entries
    )
    run.lineage_info["screening"] = screening_phase.summary(data.screening, data.accepted is not None)
    # The model: rank 0 alone writes it; every rank holds the same weights.
    if context.is_main:
        _save_model(run)
    # Every rank: the other hosts' profiles travel to rank 0, which writes rules and report.
    report = run.profiler.finish(
        job_name=run.lineage_info["host"].get("training_job"),
        metrics=metrics.read_metrics(Path(args.output_data_dir)) if context.is_main else None,
    )
    if report is not None:
        log.info("profiling report: %s", report)
    # Other ranks wait for rank 0's writes: torchrun tears the whole job down once one fails.
    distributed.barrier()


def _save_model(run: run_setup.Run) -> None:
    """model.pt, then the complete metrics.json: rank 0 alone."""
    args, classes, state = run.args, run.data.classes, run.state
    model_path = Path(args.model_dir) / checkpoint.MODEL_FILE
    # What it learned from goes with it: when it judges the next drops, it never judges these.
    basis = screening_phase.Basis.of(run.data.train_set.entries).to_document()
    inference = run.optim.bare_model.state_dict()
    document = checkpoint.model_document(inference, width=args.width, classes=classes, basis=basis)
    checkpoint.save_atomically(document, model_path)
    metrics.write_metrics(run.metrics_folders, run.lineage_info, state.history, state.baseline, complete=True)
    log.info("model saved to %s; final mIoU %.4f", model_path, state.history[-1]["miou"])


@dataclass(frozen=True)
class EpochContext:
    """What every epoch of a run trains with: built once the run is set up (and resumed)."""

    model: nn.Module  # DDP-wrapped when distributed
    criterion: SegmentationLoss
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: Any  # a GradScaler for fp16, else None
    device: torch.device
    data_loader: DataLoader[Any]
    steps: int  # optimizer steps per epoch
    epochs: int
    grad_accum: int
    log_every: int
    amp_dtype: torch.dtype | None
    channels_last: bool
    # After every optimizer step: (step in epoch, global step, the epoch's progress so far).
    on_step: Callable[[int, int, EpochProgress], None]
    comm_timer: timing.AllReduceTimer | None = None
    profiler: Profiler | None = None


def train_one_epoch(
    run: EpochContext, epoch: int, *, first_step: int, global_step: int, progress: EpochProgress
) -> int:
    """Optimizer steps `first_step`..`run.steps` of one epoch; returns the global step reached.

    Leaves early, on every rank alike, when the profiler's stopping rule has fired.
    """
    model, optimizer, scaler, grad_accum = run.model, run.optimizer, run.scaler, run.grad_accum
    comm_timer, profiler = run.comm_timer, run.profiler
    model.train()
    batches = iter(run.data_loader)
    for step_in_epoch in range(first_step, run.steps):
        step_started, step_clock = time.perf_counter(), time.time()
        step_wait, step_loss = 0.0, 0.0
        optimizer.zero_grad(set_to_none=True)
        for micro in range(grad_accum):
            # Stall = time blocked on the loader: what a faster input pipeline could win back.
            waited = time.perf_counter()
            raw_images, raw_labels = next(batches)
            step_wait += time.perf_counter() - waited
            images, labels = to_device(raw_images, raw_labels, run.device, run.channels_last)
            # DDP all-reduces gradients in every backward: accumulate locally until the last one.
            accumulate = isinstance(model, DistributedDataParallel) and micro + 1 < grad_accum
            with model.no_sync() if accumulate else contextlib.nullcontext():  # type: ignore[operator]
                with precision.autocast(run.device, run.amp_dtype):
                    loss = run.criterion(model(images), labels)
                scaled = loss / grad_accum
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            # .item() waits for the device, which also keeps the step time below honest on a GPU.
            step_loss += float(loss.item()) / grad_accum
            progress.loss_sum += float(loss.item())
            progress.micro_batches += 1
            progress.images += images.shape[0]
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        run.scheduler.step()
        global_step += 1
        step_seconds = time.perf_counter() - step_started
        # After loss.item() above: the device has finished this step's all-reduces.
        allreduce, exposed = comm_timer.collect() if comm_timer is not None else (0.0, 0.0)
        wait, compute, communication = timing.split_step(step_seconds, step_wait, exposed)
        progress.wait_seconds += wait
        progress.comm_seconds += communication
        progress.allreduce_seconds += allreduce
        progress.train_seconds += step_seconds

        if run.log_every and (step_in_epoch + 1) % run.log_every == 0:
            log.info(
                "epoch %d/%d step %d/%d loss %.4f lr %.5f stall %.1f%%",
                epoch + 1,
                run.epochs,
                step_in_epoch + 1,
                run.steps,
                progress.loss_sum / max(1, progress.micro_batches),
                optimizer.param_groups[0]["lr"],
                100 * progress.wait_seconds / max(1e-9, progress.train_seconds),
            )
        run.on_step(step_in_epoch + 1, global_step, progress)
        if profiler is not None:
            profiler.step(
                step=global_step,
                epoch=epoch,
                start=step_clock,
                data_wait=wait,
                compute=compute,
                communication=communication,
                loss=step_loss,
            )
            # A collective when a rule may stop the run: every rank asks after every step.
            if profiler.should_stop():
                break
    return global_step


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    data_loader: DataLoader[Any],
    device: torch.device,
    num_classes: int,
    *,
    amp_dtype: torch.dtype | None,
    channels_last: bool,
    profiler: Profiler | None = None,
    epoch: int = 0,
) -> ConfusionMatrix:
    """The confusion matrix over the whole val split: each rank its shard, then one all-reduce.

    With a profiler, every batch is one EVAL step in the rank's step file (`step` counts the
    pass's batches from 1, `epoch` is the training epoch it follows): data wait and compute, no
    communication (the one all-reduce comes after the last batch), no loss.
    """
    model.eval()
    confusion = ConfusionMatrix(num_classes, device)
    batches = iter(data_loader)
    for batch in itertools.count(1):
        batch_started, batch_clock = time.perf_counter(), time.time()
        try:
            raw_images, raw_labels = next(batches)
        except StopIteration:
            break
        waited = time.perf_counter() - batch_started
        images, labels = to_device(raw_images, raw_labels, device, channels_last)
        with precision.autocast(device, amp_dtype):
            logits = model(images)[0]
        # Masked indexing waits for the device, so the batch's time below is its own.
        confusion.update(labels, logits.argmax(dim=1))
        if profiler is not None:
            wait, compute, _ = timing.split_step(time.perf_counter() - batch_started, waited, 0.0)
            profiler.step(
                step=batch,
                epoch=epoch,
                start=batch_clock,
                data_wait=wait,
                compute=compute,
                communication=0.0,
                phase="EVAL",
            )
    # The shards are disjoint and cover the split: the sum counts every val pixel exactly once.
    distributed.all_reduce_sum(confusion.matrix)
    return confusion


if __name__ == "__main__":
    main(get_args_parser().parse_args())
