"""From the flags to the run's parts: checked flags, datasets, loaders, model and optimiser.

`run_setup.py` calls these in order; each raises SystemExit with a message that names the flag to
change when the flags cannot make a run.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from trainer import checkpoint, checksums, distributed, loader, precision, warm_start
from trainer.data import (
    Augment,
    Entry,
    ResumableDistributedSampler,
    SegmentationDataset,
    ShardSampler,
    parse_size,
    read_manifest,
)
from trainer.decode import ImageDecoder, pick_decoder
from trainer.model import BiSeNetV2
from trainer.schedule import WarmupPoly, default_warmup

log = logging.getLogger("trainer")


def check_args(args: argparse.Namespace) -> None:
    """Refuse what cannot make a run, before any work."""
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
    if not 0.0 <= args.max_checksum_mismatch_fraction <= 1.0:
        raise SystemExit(f"{checksums.FRACTION_FLAG} must be within [0, 1]")
    # Each of these would otherwise stop the run later, once its data is loaded and its model built.
    for flag, size in (("--crop", args.crop), ("--base-size", args.base_size)):
        if size is not None:
            try:
                parse_size(size)
            except ValueError as error:
                raise SystemExit(f"{flag}: {error}") from None
    # `not x >= 0` rather than `x < 0`: nan is refused too.
    for flag, value in (("--lr", args.lr), ("--momentum", args.momentum), ("--weight-decay", args.weight_decay)):
        if not value >= 0:
            raise SystemExit(f"{flag} must be at least 0, not {value}")
    if not args.width > 0:
        raise SystemExit(f"--width must be above 0, not {args.width}")
    if not 0 < args.scale_min <= args.scale_max:
        raise SystemExit(f"--scale-min {args.scale_min} and --scale-max {args.scale_max}: need 0 < min <= max")


def manifest_path(args: argparse.Namespace) -> Path:
    """--manifest, else manifests/<--dataset-version>.jsonl, below --data-dir."""
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


def datasets(
    args: argparse.Namespace, manifest: Path, left_out: Collection[str] = ()
) -> tuple[SegmentationDataset, SegmentationDataset]:
    """The train and val splits of the manifest, the first augmented; both checked against the
    manifest's sha256 as they are read unless `--verify-checksums false`. The pairs screening
    left out (their images, `left_out`) are in neither; a `benchmark` pair is evaluated on (both
    splits), never trained on."""
    left_out = frozenset(left_out)
    entries = [entry for entry in read_manifest(manifest) if entry.image not in left_out]
    train_entries = [entry for entry in entries if entry.split == "train" and entry.trust != "benchmark"]
    val_entries = [entry for entry in entries if entry.split == "val" or entry.trust == "benchmark"]
    if not train_entries or not val_entries:
        raise SystemExit(
            f"{manifest} has {len(train_entries)} train and {len(val_entries)} val pairs; a run needs both"
        )
    if args.verify_checksums and (missing := checksums.unpinned(entries)):
        raise SystemExit(
            f"{len(missing)} of {len(entries)} pairs of {manifest} have no image_sha256 or label_sha256 "
            f"(the first: {missing[0].image}), so their bytes cannot be checked: pass {checksums.OFF_FLAG} "
            "to train on them unchecked"
        )
    base_size = parse_size(args.base_size) if args.base_size else None
    crop = fitted_crop(parse_size(args.crop), base_size, Path(args.data_dir), train_entries)
    if crop != parse_size(args.crop):
        log.info(
            "crop %s: no training image of this version is that large, so the crop is %dx%d "
            "(the same samples, without the padding)",
            args.crop,
            *crop,
        )
        # What metrics.json records as the run's configuration is what it trained with.
        args.crop = f"{crop[0]}x{crop[1]}"
    augment = Augment(crop, args.scale_min, args.scale_max, jitter=args.jitter)
    decoder = ImageDecoder(pick_decoder(args.decoder))
    data_dir = Path(args.data_dir)
    return (
        SegmentationDataset(data_dir, train_entries, augment, base_size, decoder, verify=args.verify_checksums),
        SegmentationDataset(data_dir, val_entries, None, base_size, decoder, verify=args.verify_checksums),
    )


def fitted_crop(
    crop: tuple[int, int], base_size: tuple[int, int] | None, data_dir: Path, entries: Sequence[Entry]
) -> tuple[int, int]:
    """The crop, but never larger than the largest training image (or `--base-size`): beyond it,
    every sample is padding that costs compute and teaches nothing (a 1024x512 crop of 256x128
    scenes is 94 % padding). Image headers are read until one image covers the crop, so a
    version of large images costs one header; only one of small images is read through."""
    if base_size is not None:
        return min(crop[0], base_size[0]), min(crop[1], base_size[1])
    widest = tallest = 0
    for entry in entries:
        with Image.open(data_dir / entry.image) as image:
            width, height = image.size
        widest, tallest = max(widest, width), max(tallest, height)
        if widest >= crop[0] and tallest >= crop[1]:
            return crop
    return min(crop[0], widest), min(crop[1], tallest)


def loaders(
    args: argparse.Namespace,
    context: distributed.Context,
    train_set: SegmentationDataset,
    val_set: SegmentationDataset,
) -> tuple[ResumableDistributedSampler, DataLoader[Any], DataLoader[Any]]:
    """This rank's training sampler and loader, and its val loader (`loader.py`)."""
    cuda = context.device.type == "cuda"
    train_sampler = ResumableDistributedSampler(train_set, context.world_size, context.rank, seed=args.seed)
    workers = args.workers if args.workers >= 0 else loader.default_workers(context.local_world_size, accelerator=cuda)
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


def warm_start_of(args: argparse.Namespace) -> warm_start.WarmStart:
    """What the weights start from: --from-scratch, else --init-from, else the `model` channel's
    model.pt or model.tar.gz (`warm_start.py`), with the reason either way."""
    return warm_start.resolve(
        init_from=args.init_from, from_scratch=args.from_scratch, channel=os.environ.get("SM_CHANNEL_MODEL")
    )


def baseline_model(args: argparse.Namespace) -> str | None:
    """The accepted model to compare with: --baseline-model, else the `model` channel's, even
    when training from scratch (the quality gate judges against it either way)."""
    if args.baseline_model:
        return str(args.baseline_model)
    found = warm_start.from_channel(os.environ.get("SM_CHANNEL_MODEL"))
    return str(found.path) if found.path is not None else None


def models(
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
        checkpoint.load_weights(bare_model, Path(init_from), args.width, classes)
    if cuda and context.world_size > 1 and args.sync_bn:
        # Not on CPU: there SyncBatchNorm raises "SyncBatchNorm layers only work with GPU modules".
        bare_model = nn.SyncBatchNorm.convert_sync_batchnorm(bare_model)  # type: ignore[no-untyped-call]
    # Channels-last feeds tensor cores without transposes; on CPU it only slows convolutions.
    channels_last = cuda and args.channels_last
    if channels_last:
        bare_model = bare_model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    model: nn.Module = bare_model
    if distributed.is_distributed():
        model = DistributedDataParallel(bare_model, device_ids=[context.local_rank] if cuda else None)
    return bare_model, model, channels_last


def optimization(
    args: argparse.Namespace, model: nn.Module, steps_per_epoch: int, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, Any, torch.dtype | None]:
    """SGD, warm-up + poly schedule, and mixed precision (with a scaler only for fp16)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    total_steps = steps_per_epoch * args.epochs
    warmup = args.warmup_steps if args.warmup_steps >= 0 else default_warmup(total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupPoly(total_steps, min(warmup, total_steps - 1), args.poly_power)
    )
    amp_dtype = precision.amp_dtype(args.amp, device)
    # Only fp16 needs loss scaling: bf16 has fp32's exponent range.
    scaler = precision.grad_scaler() if amp_dtype == torch.float16 else None
    return optimizer, scheduler, scaler, amp_dtype
