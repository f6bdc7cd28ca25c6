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
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from trainer import checkpoint, distributed, lineage, loader, timing
from trainer.data import (
    DEFAULT_JITTER,
    Augment,
    ResumableDistributedSampler,
    SegmentationDataset,
    ShardSampler,
    class_weights,
    parse_size,
    read_manifest,
    to_device,
)
from trainer.decode import DECODERS, ImageDecoder, pick_decoder
from trainer.metrics import (
    IGNORE_INDEX,
    ConfusionMatrix,
    metric_line,
    per_class,
    write_json_atomically,
)
from trainer.model import BiSeNetV2
from trainer.profiling import monitor as profiling_monitor
from trainer.profiling.session import MODES as PROFILING_MODES
from trainer.profiling.session import Profiler
from trainer.schedule import WarmupPoly, default_warmup

log = logging.getLogger("trainer")

# The 19 Cityscapes training classes. The trainer imports nothing from functions/, so the default
# taxonomy is repeated here; a test checks that the two lists agree.
CITYSCAPES_CLASSES = (
    "road,sidewalk,building,wall,fence,pole,traffic light,traffic sign,vegetation,terrain,sky,"
    "person,rider,car,truck,bus,train,motorcycle,bicycle"
)


def str2bool(text: str) -> bool:
    """SageMaker passes every hyperparameter as a string: "true", "True", "1" and the opposites."""
    value = text.strip().lower()
    if value in {"true", "1", "yes", "y", "on"}:
        return True
    if value in {"false", "0", "no", "n", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag(group: argparse._ArgumentGroup, name: str, default: bool, description: str) -> None:
    """A boolean hyperparameter: `--name true|false` (SageMaker's form), or a bare `--name`."""
    group.add_argument(
        name, type=str2bool, nargs="?", const=True, default=default, metavar="BOOL",
        help=description,
    )  # fmt: skip


def _profiling_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    profiling = parser.add_argument_group("profiling and rules (trainer/profiling/)")
    profiling.add_argument(
        "--profiling",
        choices=PROFILING_MODES,
        # With SageMaker Debugger profiling the job (RETRAIN_PROFILING=debugger), we stay out.
        default={"debugger": "off"}.get(env("RETRAIN_PROFILING", ""), env("RETRAIN_PROFILING"))
        or "builtin",
        help="builtin: sample the hosts, time every step, evaluate the rules, write report.html "
        "(default; RETRAIN_PROFILING); off: none of it",
    )
    profiling.add_argument(
        "--profiling-interval-ms",
        type=int,
        choices=profiling_monitor.ALLOWED_INTERVALS_MS,
        default=int(
            env("RETRAIN_PROFILING_INTERVAL_MS", str(profiling_monitor.DEFAULT_INTERVAL_MS))
        ),
        help="system sampling interval in ms, as SageMaker's ProfilerConfig allows "
        "(RETRAIN_PROFILING_INTERVAL_MS)",
    )
    profiling.add_argument(
        "--rules-every-seconds",
        type=float,
        default=0.0,
        help="rank 0 evaluates the rules this often while training (0: at the end only, unless "
        "--stop-on-rule asks for 300 s)",
    )
    profiling.add_argument(
        "--stop-on-rule",
        default="",
        help="comma-separated rules that stop the run when they find issues "
        "(e.g. LossNotDecreasing)",
    )
    profiling.add_argument(
        "--rule-parameters",
        default="",
        help='per-rule overrides as JSON, e.g. \'{"DataStall": {"threshold": 0.3}}\'',
    )


def get_args_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Train BiSeNetV2 on a frozen dataset version.")

    io = parser.add_argument_group("data and outputs (defaults from the SageMaker environment)")
    io.add_argument(
        "--data-dir",
        default=env("SM_CHANNEL_TRAIN"),
        help="folder holding the manifest's images/, labels/ and manifests/",
    )
    io.add_argument(
        "--manifest",
        default=None,
        help="manifest, relative to --data-dir (default manifests/<version>.jsonl)",
    )
    io.add_argument(
        "--dataset-version",
        default=None,
        help="dataset version (default: the manifest's file name)",
    )
    io.add_argument("--model-dir", default=env("SM_MODEL_DIR"), help="where model.pt goes")
    io.add_argument(
        "--output-data-dir",
        default=env("SM_OUTPUT_DATA_DIR"),
        help="where metrics.json goes (it is also written beside the model)",
    )
    io.add_argument(
        "--checkpoint-dir",
        default="/opt/ml/checkpoints",
        help="resumable checkpoints; a restarted job resumes from the newest",
    )
    io.add_argument(
        "--init-from",
        default=None,
        help="model.pt to start from (default: $SM_CHANNEL_MODEL/model.pt if present)",
    )
    _flag(io, "--from-scratch", False, "start from random weights, ignoring any --init-from")
    io.add_argument(
        "--baseline-model",
        default=None,
        help="model.pt of the accepted model, evaluated on the same val split",
    )
    io.add_argument(
        "--classes",
        default=CITYSCAPES_CLASSES,
        help="comma-separated class names; a name's position is its train id",
    )

    opt = parser.add_argument_group("model and optimisation")
    opt.add_argument(
        "--width",
        type=float,
        default=1.0,
        help="channel width multiplier (1.0: the paper's BiSeNetV2, 3.4 M params)",
    )
    opt.add_argument("--epochs", type=int, default=100)
    opt.add_argument("--batch-size", type=int, default=8, help="images per process per micro-batch")
    opt.add_argument("--val-batch-size", type=int, default=0, help="0: same as --batch-size")
    opt.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    opt.add_argument("--lr", type=float, default=0.05, help="peak learning rate (SGD)")
    opt.add_argument("--momentum", type=float, default=0.9)
    opt.add_argument("--weight-decay", type=float, default=5e-4)
    opt.add_argument(
        "--warmup-steps",
        type=int,
        default=-1,
        help="linear warm-up steps (-1: 5%% of the run, at most 1000)",
    )
    opt.add_argument("--poly-power", type=float, default=0.9)
    opt.add_argument(
        "--aux-weight",
        type=float,
        default=1.0,
        help="weight of each booster head's loss (0: no booster heads)",
    )
    opt.add_argument(
        "--class-weighting",
        choices=("none", "balanced"),
        default="balanced",
        help="balanced: rare classes weigh more, from the manifest's class_pixels",
    )
    opt.add_argument("--crop", default="1024x512", help="training crop, WIDTHxHEIGHT")
    opt.add_argument(
        "--base-size",
        default=None,
        help="resize every image to WIDTHxHEIGHT before augmenting (default: as is)",
    )
    opt.add_argument("--scale-min", type=float, default=0.5, help="random scale, lower bound")
    opt.add_argument("--scale-max", type=float, default=2.0, help="random scale, upper bound")
    opt.add_argument(
        "--jitter",
        type=float,
        default=DEFAULT_JITTER,
        help="photometric jitter: brightness and contrast 1 +- this, colour 1 +- this/4 (0: off)",
    )
    opt.add_argument("--seed", type=int, default=0)

    system = parser.add_argument_group("distributed, precision, loading")
    system.add_argument(
        "--backend",
        choices=("torch", "smddp"),
        default="torch",
        help="torch: NCCL on GPUs, gloo on CPU; smddp: SageMaker's, P4d/P4de/P5",
    )
    _flag(system, "--amp", True, "autocast on GPUs: bf16 where supported, else fp16 + scaler")
    _flag(system, "--channels-last", True, "channels-last memory format (GPUs only)")
    _flag(system, "--sync-bn", True, "SyncBatchNorm across ranks (GPUs only)")
    system.add_argument(
        "--workers",
        type=int,
        default=-1,
        help="loader workers per process (-1: the process's share of the cores less one on a "
        "GPU host, 0 on CPU)",
    )
    system.add_argument(
        "--prefetch-factor",
        type=int,
        default=0,
        help="batches each worker prepares ahead (0: about 8 per process, at least 2 each)",
    )
    system.add_argument(
        "--decoder",
        choices=("auto", *DECODERS),
        default="auto",
        help="JPEG decoder (auto: the fastest installed; Pillow always is)",
    )
    _flag(
        system, "--time-communication", True,
        "time DDP's all-reduces with a communication hook (compute/communication split)",
    )  # fmt: skip
    _flag(system, "--deterministic", False, "deterministic kernels (slower on GPUs)")

    _profiling_arguments(parser)

    ckpt = parser.add_argument_group("checkpoints and logging")
    ckpt.add_argument(
        "--checkpoint-every-steps",
        type=int,
        default=0,
        help="checkpoint every N optimizer steps too (0: off)",
    )
    ckpt.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=900.0,
        help="checkpoint whenever this long has passed (0: off)",
    )
    ckpt.add_argument("--keep-checkpoints", type=int, default=2)
    ckpt.add_argument(
        "--eval-every", type=int, default=1, help="evaluate every N epochs (and after the last)"
    )
    ckpt.add_argument("--log-every", type=int, default=20, help="progress line every N steps")
    ckpt.add_argument(
        "--stop-after-steps",
        type=int,
        default=0,
        help="test hook: exit after N optimizer steps, as an interruption would",
    )
    return parser


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


@dataclass
class RunState:
    """Where training stands: what a checkpoint restores."""

    epoch: int = 0
    step_in_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] | None = None
    progress: EpochProgress = field(default_factory=EpochProgress)
    init_from: str | None = None
    resumed_from: str | None = None


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
        train(args, context)
    finally:
        distributed.cleanup()


# One function on purpose, like torchvision's reference: the run reads top to bottom.
def train(args: argparse.Namespace, context: distributed.Context) -> None:  # noqa: PLR0912, PLR0915
    _check_args(args)
    device, cuda = context.device, context.device.type == "cuda"
    # Ranks draw different dropout noise, like independent replicas would; the weights still start
    # equal, because DDP broadcasts rank 0's at construction.
    random.seed(args.seed + context.rank)
    np.random.seed(args.seed + context.rank)
    torch.manual_seed(args.seed + context.rank)
    if cuda:
        torch.backends.cudnn.benchmark = not args.deterministic
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)

    # --- data: the manifest is the dataset, nothing is listed ---
    manifest = _manifest_path(args)
    dataset_version = args.dataset_version or manifest.stem
    classes = [name.strip() for name in args.classes.split(",")]
    train_set, val_set = _datasets(args, manifest)
    train_sampler, train_loader, val_loader = _loaders(args, context, train_set, val_set)
    steps_per_epoch = len(train_sampler) // (args.batch_size * args.grad_accum)
    if steps_per_epoch < 1:
        raise SystemExit(
            f"{len(train_sampler)} training images per process cannot fill one step of "
            f"{args.batch_size} x {args.grad_accum}: lower --batch-size or --grad-accum"
        )

    # --- model and optimisation ---
    state = RunState(init_from=_init_from(args))
    bare_model, model, channels_last = _build_model(args, context, classes, state.init_from)
    # Wraps DDP's own all-reduce, so gradients are averaged exactly as without it.
    comm_timer = timing.attach_timer(model, device) if args.time_communication else None
    optimizer, scheduler, scaler, amp_dtype = _optimization(args, model, steps_per_epoch, device)
    weights = (
        class_weights(train_set.entries, len(classes))
        if args.class_weighting == "balanced"
        else None
    )
    criterion = SegmentationLoss(args.aux_weight, weights).to(device)

    # --- resume: a restarted job (a spot interruption) continues from the newest checkpoint ---
    newest = checkpoint.newest(Path(args.checkpoint_dir)) if context.is_main else None
    # Every rank must resume at the same step or their collectives would not line up: rank 0
    # chooses, and each rank reads that file from its own copy of the folder (SageMaker restores
    # the checkpoint prefix onto every host).
    newest_name = distributed.broadcast_object(newest.name if newest else None)
    if newest_name is not None:
        state = _resume(
            Path(args.checkpoint_dir) / newest_name, bare_model, optimizer, scheduler, scaler,
            dataset_version=dataset_version, context=context,
        )  # fmt: skip

    if args.baseline_model and state.baseline is None:
        state.baseline = _evaluate_baseline(Path(args.baseline_model), val_loader, device, classes)
        if context.is_main:
            print(metric_line(baseline_miou=state.baseline["miou"]), flush=True)

    lineage_info = {
        "dataset_version": dataset_version,
        "code_sha256": lineage.code_sha256(),
        "torch_version": torch.__version__,
        "host": lineage.host_info(context),
        "seed": args.seed,
        "config": dict(vars(args)),
        "classes": classes,
        "train_images": len(train_set),
        "val_images": len(val_set),
        "init_from": state.init_from,
        "resumed_from": state.resumed_from,
        "loader": {
            "decoder": train_set.decoder.name,
            "workers": train_loader.num_workers,
            "prefetch_factor": train_loader.prefetch_factor,
            "pin_memory": train_loader.pin_memory,
        },
    }
    saver = Checkpointer(args, context, dataset_version)
    profiler = _profiler(args, context, lineage_info["loader"]).start()
    log.info(
        "dataset %s: %d train, %d val; %d steps/epoch x %d epochs; %d x %s (%s); "
        "BiSeNetV2 width %g, %d parameters",
        dataset_version, len(train_set), len(val_set), steps_per_epoch, args.epochs,
        context.world_size, device.type, context.backend, args.width,
        sum(p.numel() for p in bare_model.parameters()),
    )  # fmt: skip

    def on_step(step_in_epoch: int, global_step: int, progress: EpochProgress) -> None:
        """After every optimizer step: a checkpoint if one is due, and the test hook's stop."""
        if saver.due(global_step):
            state.step_in_epoch, state.progress = step_in_epoch, progress
            saver.save(
                state, global_step, model=bare_model, optimizer=optimizer, scheduler=scheduler,
                scaler=scaler,
            )  # fmt: skip
        if args.stop_after_steps and global_step >= args.stop_after_steps:
            # Die as a reclaimed spot instance does: at once, with no cleanup and no final save.
            log.warning("killing this process after %d steps (--stop-after-steps)", global_step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    # --- train ---
    global_step = state.epoch * steps_per_epoch + state.step_in_epoch
    for epoch in range(state.epoch, args.epochs):
        epoch_started = time.perf_counter()
        # Without set_epoch every epoch would shuffle into the same order.
        train_sampler.set_epoch(epoch)
        first_step = state.step_in_epoch if epoch == state.epoch else 0
        # Resuming mid-epoch: skip exactly the samples the interrupted run had consumed.
        train_sampler.skip(first_step * args.batch_size * args.grad_accum)
        progress = state.progress if first_step else EpochProgress()
        # Training time spent in this epoch before an interruption, so epoch_seconds is whole.
        seconds_before = progress.train_seconds

        global_step = train_one_epoch(
            model, criterion, optimizer, train_loader,
            scheduler=scheduler, scaler=scaler, device=device, epoch=epoch, args=args,
            first_step=first_step, steps=steps_per_epoch, global_step=global_step,
            progress=progress, amp_dtype=amp_dtype, channels_last=channels_last, on_step=on_step,
            comm_timer=comm_timer, profiler=profiler,
        )  # fmt: skip
        totals = _reduce_progress(progress, device, context.world_size)
        # Every rank learnt the same verdict in the same step (a broadcast from rank 0).
        stopped_by = profiler.stopped_by

        if (epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs or stopped_by:
            # The bare module: DDP's forward may broadcast buffers, a collective that would hang
            # when the val shards differ in length.
            confusion = evaluate(
                bare_model, val_loader, device, len(classes),
                amp_dtype=amp_dtype, channels_last=channels_last,
            )  # fmt: skip
            record = _epoch_record(
                epoch, totals, optimizer, confusion, classes=classes, steps=steps_per_epoch
            )
            record["epoch_seconds"] = round(time.perf_counter() - epoch_started + seconds_before, 3)
            state.history.append(record)
            if context.is_main:
                print(_epoch_metric_line(record), flush=True)
                if stopped_by:
                    lineage_info["stopped_by_rule"] = stopped_by
                _write_metrics(args, lineage_info, state, complete=False)
        # An epoch-end checkpoint too: a restart never redoes a finished epoch or its evaluation.
        state.epoch, state.step_in_epoch, state.progress = epoch + 1, 0, EpochProgress()
        saver.save(
            state, global_step, model=bare_model, optimizer=optimizer, scheduler=scheduler,
            scaler=scaler,
        )  # fmt: skip
        if stopped_by:
            log.warning(
                "rule %s stopped the run after epoch %d (--stop-on-rule)", stopped_by, epoch + 1
            )
            break

    # --- the model: rank 0 alone writes it; every rank holds the same weights ---
    if context.is_main:
        model_path = Path(args.model_dir) / checkpoint.MODEL_FILE
        document = checkpoint.model_document(
            bare_model.state_dict(), width=args.width, classes=classes
        )
        checkpoint.save_atomically(document, model_path)
        _write_metrics(args, lineage_info, state, complete=True)
        log.info("model saved to %s; final mIoU %.4f", model_path, state.history[-1]["miou"])
    # Every rank: the other hosts' profiles travel to rank 0, which writes rules and report.
    report = profiler.finish(
        job_name=lineage_info["host"].get("training_job"),
        metrics=_read_metrics(args) if context.is_main else None,
    )
    if report is not None:
        log.info("profiling report: %s", report)
    # Other ranks wait for rank 0's writes: torchrun tears the whole job down once one fails.
    distributed.barrier()


def train_one_epoch(
    model: nn.Module,
    criterion: SegmentationLoss,
    optimizer: torch.optim.Optimizer,
    data_loader: DataLoader[Any],
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: Any,
    device: torch.device,
    epoch: int,
    args: argparse.Namespace,
    first_step: int,
    steps: int,
    global_step: int,
    progress: EpochProgress,
    amp_dtype: torch.dtype | None,
    channels_last: bool,
    on_step: Callable[[int, int, EpochProgress], None],
    comm_timer: timing.AllReduceTimer | None = None,
    profiler: Profiler | None = None,
) -> int:
    """Optimizer steps `first_step`..`steps` of one epoch; returns the global step reached.

    Leaves early, on every rank alike, when the profiler's stopping rule has fired.
    """
    model.train()
    batches = iter(data_loader)
    for step_in_epoch in range(first_step, steps):
        step_started, step_clock = time.perf_counter(), time.time()
        step_wait, step_loss = 0.0, 0.0
        optimizer.zero_grad(set_to_none=True)
        for micro in range(args.grad_accum):
            # Stall = time blocked on the loader: what a faster input pipeline could win back.
            waited = time.perf_counter()
            raw_images, raw_labels = next(batches)
            step_wait += time.perf_counter() - waited
            images, labels = to_device(raw_images, raw_labels, device, channels_last)
            # DDP all-reduces gradients in every backward: accumulate locally until the last one.
            accumulate = isinstance(model, DistributedDataParallel) and micro + 1 < args.grad_accum
            with model.no_sync() if accumulate else contextlib.nullcontext():  # type: ignore[operator]
                with _autocast(device, amp_dtype):
                    loss = criterion(model(images), labels)
                scaled = loss / args.grad_accum
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            # .item() waits for the device, which also keeps the step time below honest on a GPU.
            step_loss += float(loss.item()) / args.grad_accum
            progress.loss_sum += float(loss.item())
            progress.micro_batches += 1
            progress.images += images.shape[0]
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        global_step += 1
        step_seconds = time.perf_counter() - step_started
        # After loss.item() above: the device has finished this step's all-reduces.
        allreduce, exposed = comm_timer.collect() if comm_timer is not None else (0.0, 0.0)
        wait, compute, communication = timing.split_step(step_seconds, step_wait, exposed)
        progress.wait_seconds += wait
        progress.comm_seconds += communication
        progress.allreduce_seconds += allreduce
        progress.train_seconds += step_seconds

        if args.log_every and (step_in_epoch + 1) % args.log_every == 0:
            log.info(
                "epoch %d/%d step %d/%d loss %.4f lr %.5f stall %.1f%%",
                epoch + 1, args.epochs, step_in_epoch + 1, steps,
                progress.loss_sum / max(1, progress.micro_batches),
                optimizer.param_groups[0]["lr"],
                100 * progress.wait_seconds / max(1e-9, progress.train_seconds),
            )  # fmt: skip
        on_step(step_in_epoch + 1, global_step, progress)
        if profiler is not None:
            profiler.step(
                step=global_step, epoch=epoch, start=step_clock, data_wait=wait, compute=compute,
                communication=communication, loss=step_loss,
            )  # fmt: skip
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
) -> ConfusionMatrix:
    """The confusion matrix over the whole val split: each rank its shard, then one all-reduce."""
    model.eval()
    confusion = ConfusionMatrix(num_classes, device)
    for raw_images, raw_labels in data_loader:
        images, labels = to_device(raw_images, raw_labels, device, channels_last)
        with _autocast(device, amp_dtype):
            logits = model(images)[0]
        confusion.update(labels, logits.argmax(dim=1))
    # The shards are disjoint and cover the split: the sum counts every val pixel exactly once.
    distributed.all_reduce_sum(confusion.matrix)
    return confusion


class SegmentationLoss(nn.Module):
    """Cross entropy on the main head plus the weighted booster heads; 255 is ignored."""

    def __init__(self, aux_weight: float, class_weights: list[float] | None = None) -> None:
        super().__init__()
        self.aux_weight = aux_weight
        self.class_weights: torch.Tensor | None
        self.register_buffer(
            "class_weights", torch.tensor(class_weights) if class_weights is not None else None
        )

    def forward(self, outputs: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        # In fp32 even under autocast: a softmax over 19 classes in bf16 loses the small terms.
        loss = self._cross_entropy(outputs[0], labels)
        for aux in outputs[1:]:
            loss = loss + self.aux_weight * self._cross_entropy(aux, labels)
        return loss

    def _cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.float(), labels, weight=self.class_weights, ignore_index=IGNORE_INDEX
        )


class Checkpointer:
    """Decides when a checkpoint is due; writes it from rank 0 with every rank's RNG state."""

    def __init__(
        self, args: argparse.Namespace, context: distributed.Context, dataset_version: str
    ) -> None:
        self.args = args
        self.context = context
        self.dataset_version = dataset_version
        self.last_saved = time.monotonic()

    def due(self, global_step: int) -> bool:
        every_steps, every_seconds = (
            self.args.checkpoint_every_steps,
            self.args.checkpoint_every_seconds,
        )
        if every_steps and global_step % every_steps == 0:
            return True
        if not every_seconds:
            return False
        # Clocks differ between hosts, so rank 0's decides: ranks that disagreed would wait
        # forever in the collectives inside save().
        late = time.monotonic() - self.last_saved >= every_seconds
        return distributed.broadcast_flag(late, self.context.device)

    def save(
        self,
        state: RunState,
        global_step: int,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: Any,
    ) -> None:
        # Every rank's RNG state and running sums, so each resumed rank continues its own streams.
        rng_states = distributed.gather_objects(checkpoint.rng_state())
        progress_states = distributed.gather_objects(asdict(state.progress))
        self.last_saved = time.monotonic()
        if not self.context.is_main:
            return
        document = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "epoch": state.epoch,
            "step_in_epoch": state.step_in_epoch,
            "global_step": global_step,
            "world_size": self.context.world_size,
            "dataset_version": self.dataset_version,
            "init_from": state.init_from,
            "history": state.history,
            "baseline": state.baseline,
            "progress": progress_states,
            "rng": rng_states,
        }
        directory = Path(self.args.checkpoint_dir)
        path = checkpoint.save_checkpoint(
            document, directory, global_step, self.args.keep_checkpoints
        )
        log.info(
            "checkpoint %s (epoch %d, step %d)", path.name, state.epoch + 1, state.step_in_epoch
        )


def _resume(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: Any,
    *,
    dataset_version: str,
    context: distributed.Context,
) -> RunState:
    document = checkpoint.load(path)
    if document["dataset_version"] != dataset_version:
        raise SystemExit(
            f"{path} is a checkpoint of dataset {document['dataset_version']}, not "
            f"{dataset_version}: give every job its own checkpoint folder"
        )
    if document["world_size"] != context.world_size:
        # Sampler positions are per rank: another world size shards the epoch differently.
        raise SystemExit(
            f"{path} was written by {document['world_size']} processes, this job has "
            f"{context.world_size}: resume with the same instance count"
        )
    model.load_state_dict(document["model"])
    optimizer.load_state_dict(document["optimizer"])
    scheduler.load_state_dict(document["scheduler"])
    if scaler is not None and document["scaler"] is not None:
        scaler.load_state_dict(document["scaler"])
    # Last, so that nothing above draws from the restored streams.
    checkpoint.set_rng_state(document["rng"][context.rank])
    log.info(
        "resumed from %s: epoch %d, step %d",
        path, document["epoch"] + 1, document["step_in_epoch"],
    )  # fmt: skip
    return RunState(
        epoch=document["epoch"],
        step_in_epoch=document["step_in_epoch"],
        history=document["history"],
        baseline=document["baseline"],
        progress=EpochProgress(**document["progress"][context.rank]),
        init_from=document["init_from"],
        resumed_from=str(path),
    )


def _loaders(
    args: argparse.Namespace,
    context: distributed.Context,
    train_set: SegmentationDataset,
    val_set: SegmentationDataset,
) -> tuple[ResumableDistributedSampler, DataLoader[Any], DataLoader[Any]]:
    cuda = context.device.type == "cuda"
    train_sampler = ResumableDistributedSampler(
        train_set, context.world_size, context.rank, seed=args.seed
    )
    workers = (
        args.workers
        if args.workers >= 0
        else loader.default_workers(context.local_world_size, accelerator=cuda)
    )
    loading: dict[str, Any] = {
        "workers": workers,
        # Pinned pages: the host-to-GPU copy can then run asynchronously (non_blocking).
        "pin_memory": cuda,
        "prefetch_factor": args.prefetch_factor,
    }
    train_loader = loader.make_loader(
        train_set,
        batch_size=args.batch_size,
        sampler=train_sampler,
        # Full batches only: BiSeNetV2's context block batch-normalises a 1x1 pooled map, which
        # cannot be done for a batch of one.
        drop_last=True,
        **loading,
    )
    val_loader = loader.make_loader(
        val_set,
        batch_size=args.val_batch_size or args.batch_size,
        # Every val sample exactly once across ranks: DistributedSampler would pad with repeats.
        sampler=ShardSampler(len(val_set), context.world_size, context.rank),
        **loading,
    )
    return train_sampler, train_loader, val_loader


def _build_model(
    args: argparse.Namespace,
    context: distributed.Context,
    classes: list[str],
    init_from: str | None,
) -> tuple[nn.Module, nn.Module, bool]:
    """The bare model (for evaluation and saving), the one to train (DDP), and channels-last."""
    device, cuda = context.device, context.device.type == "cuda"
    bare_model: nn.Module = BiSeNetV2(len(classes), width=args.width, aux=args.aux_weight > 0)
    bare_model = bare_model.to(device)
    if init_from is not None:
        _load_weights(bare_model, Path(init_from), args.width, classes)
    if cuda and context.world_size > 1 and args.sync_bn:
        # Not on CPU: there SyncBatchNorm raises "SyncBatchNorm layers only work with GPU modules".
        bare_model = nn.SyncBatchNorm.convert_sync_batchnorm(bare_model)  # type: ignore[no-untyped-call]
    # Channels-last feeds tensor cores without transposes; on CPU it only slows convolutions.
    channels_last = cuda and args.channels_last
    if channels_last:
        bare_model = bare_model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    model: nn.Module = bare_model
    if distributed.is_distributed():
        model = DistributedDataParallel(
            bare_model, device_ids=[context.local_rank] if cuda else None
        )
    return bare_model, model, channels_last


def _optimization(
    args: argparse.Namespace, model: nn.Module, steps_per_epoch: int, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, Any, torch.dtype | None]:
    """SGD, warm-up + poly schedule, and mixed precision (with a scaler only for fp16)."""
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    total_steps = steps_per_epoch * args.epochs
    warmup = args.warmup_steps if args.warmup_steps >= 0 else default_warmup(total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupPoly(total_steps, min(warmup, total_steps - 1), args.poly_power)
    )
    amp_dtype = _amp_dtype(args.amp, device)
    # Only fp16 needs loss scaling: bf16 has fp32's exponent range.
    scaler = _grad_scaler() if amp_dtype == torch.float16 else None
    return optimizer, scheduler, scaler, amp_dtype


def _check_args(args: argparse.Namespace) -> None:
    missing = [
        flag
        for flag, value in (
            ("--data-dir (or SM_CHANNEL_TRAIN)", args.data_dir),
            ("--model-dir (or SM_MODEL_DIR)", args.model_dir),
            ("--output-data-dir (or SM_OUTPUT_DATA_DIR)", args.output_data_dir),
        )
        if not value
    ]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}")
    if args.batch_size < 2:
        raise SystemExit("--batch-size must be at least 2: BatchNorm needs two samples per rank")
    if args.grad_accum < 1 or args.epochs < 1 or args.eval_every < 1:
        raise SystemExit("--grad-accum, --epochs and --eval-every must be at least 1")


def _manifest_path(args: argparse.Namespace) -> Path:
    data_dir = Path(args.data_dir)
    if args.manifest:
        path = Path(args.manifest)
        path = path if path.is_absolute() else data_dir / path
    elif args.dataset_version:
        path = data_dir / "manifests" / f"{args.dataset_version}.jsonl"
    else:
        raise SystemExit("name the dataset: --manifest or --dataset-version")
    if not path.is_file():
        raise SystemExit(f"no manifest at {path}")
    return path


def _datasets(
    args: argparse.Namespace, manifest: Path
) -> tuple[SegmentationDataset, SegmentationDataset]:
    entries = read_manifest(manifest)
    train_entries = [entry for entry in entries if entry.split == "train"]
    val_entries = [entry for entry in entries if entry.split == "val"]
    if not train_entries or not val_entries:
        raise SystemExit(
            f"{manifest} has {len(train_entries)} train and {len(val_entries)} val pairs; "
            "a run needs both"
        )
    base_size = parse_size(args.base_size) if args.base_size else None
    augment = Augment(parse_size(args.crop), args.scale_min, args.scale_max, jitter=args.jitter)
    decoder = ImageDecoder(pick_decoder(args.decoder))
    data_dir = Path(args.data_dir)
    return (
        SegmentationDataset(data_dir, train_entries, augment, base_size, decoder),
        SegmentationDataset(data_dir, val_entries, None, base_size, decoder),
    )


def _init_from(args: argparse.Namespace) -> str | None:
    """The accepted model to start from: --init-from, else the `model` channel, unless scratch."""
    if args.from_scratch:
        return None
    if args.init_from:
        return str(args.init_from)
    channel = os.environ.get("SM_CHANNEL_MODEL")
    default = Path(channel) / checkpoint.MODEL_FILE if channel else None
    return str(default) if default is not None and default.is_file() else None


def _load_weights(model: nn.Module, path: Path, width: float, classes: list[str]) -> None:
    document = checkpoint.load_model_document(path)
    if document["width"] != width or document["classes"] != classes:
        raise SystemExit(
            f"{path} is width {document['width']} with {len(document['classes'])} classes; this "
            f"run is width {width} with {len(classes)}: pass --from-scratch or matching flags"
        )
    # The model file carries no booster heads; they start fresh.
    missing, unexpected = model.load_state_dict(document["state_dict"], strict=False)
    if unexpected or any(not key.startswith("aux_heads.") for key in missing):
        raise SystemExit(
            f"{path} does not fit BiSeNetV2: missing {missing}, unexpected {unexpected}"
        )
    log.info("initialised from %s", path)


def _evaluate_baseline(
    path: Path, data_loader: DataLoader[Any], device: torch.device, classes: list[str]
) -> dict[str, Any]:
    """The accepted model on this run's val split, so that the two compare on the same images."""
    document = checkpoint.load_model_document(path)
    if document["classes"] != classes:
        raise SystemExit(f"the baseline {path} predicts other classes than this run")
    baseline = BiSeNetV2(len(classes), width=document["width"], aux=False).to(device)
    baseline.load_state_dict(document["state_dict"])
    confusion = evaluate(
        baseline, data_loader, device, len(classes), amp_dtype=None, channels_last=False
    )
    log.info("baseline %s: mIoU %.4f", path, confusion.miou())
    return {
        "model": str(path),
        "miou": round(confusion.miou(), 6),
        "per_class_iou": per_class(classes, confusion.iou()),
    }


def _amp_dtype(enabled: bool, device: torch.device) -> torch.dtype | None:
    if not enabled or device.type != "cuda":
        # Not on CPU: autocast there is slow without bf16 hardware and would change what the
        # offline run and the tests reproduce.
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _autocast(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[Any]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _grad_scaler() -> Any:
    # torch.amp.GradScaler is the spelling since torch 2.3; torch.cuda.amp's warns from 2.4 on.
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def _reduce_progress(
    progress: EpochProgress, device: torch.device, world_size: int
) -> dict[str, Any]:
    """The epoch over all ranks (loss, images/s, where step time went), and each rank's split."""
    sums = torch.tensor(
        [progress.loss_sum, progress.micro_batches, progress.images], dtype=torch.float64,
        device=device,
    )  # fmt: skip
    distributed.all_reduce_sum(sums)
    loss, micro_batches, images = sums.tolist()
    # Every rank's own times: a rank starved by its loader shows a high stall while the others
    # show the same time as communication (they wait for it in the all-reduce).
    every_rank = [
        EpochProgress(**fields) for fields in distributed.gather_objects(asdict(progress))
    ]
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


def _epoch_record(
    epoch: int,
    totals: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    confusion: ConfusionMatrix,
    *,
    classes: list[str],
    steps: int,
) -> dict[str, Any]:
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


def _epoch_metric_line(record: dict[str, Any]) -> str:
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


def _profiler(
    args: argparse.Namespace, context: distributed.Context, loader_info: dict[str, Any]
) -> Profiler:
    stop_on = [name.strip() for name in args.stop_on_rule.split(",") if name.strip()]
    every = args.rules_every_seconds or (300.0 if stop_on else 0.0)
    overrides = json.loads(args.rule_parameters) if args.rule_parameters else None
    return Profiler(
        Path(args.output_data_dir), mode=args.profiling, interval_ms=args.profiling_interval_ms,
        rank=context.rank, local_rank=context.local_rank,
        world_size=context.world_size, rules_every_seconds=every, stop_on=stop_on,
        overrides=overrides, loader=loader_info, device=context.device,
    )  # fmt: skip


def _read_metrics(args: argparse.Namespace) -> dict[str, Any] | None:
    path = Path(args.output_data_dir) / "metrics.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _write_metrics(
    args: argparse.Namespace, lineage_info: dict[str, Any], state: RunState, *, complete: bool
) -> None:
    """metrics.json, rewritten every epoch, so even an interrupted job leaves its lineage."""
    last = state.history[-1] if state.history else None
    document = {
        "schema_version": 1,
        **lineage_info,
        "epochs": state.history,
        "miou": last["miou"] if last else None,
        "per_class_iou": last["per_class_iou"] if last else {},
        "baseline": state.baseline,
        "complete": complete,
    }
    for folder in dict.fromkeys((args.output_data_dir, args.model_dir)):
        write_json_atomically(Path(folder) / "metrics.json", document)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
