"""What a run needs to be reproduced: the exact code, and where it ran."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer import checksums
from trainer.distributed import Context

if TYPE_CHECKING:
    import argparse

    from torch.utils.data import DataLoader

    from trainer.checkpoint import RunState
    from trainer.data import SegmentationDataset


def code_sha256(folder: Path | None = None) -> str:
    """One digest of the trainer's own source files (names and bytes), in name order."""
    folder = folder or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def host_info(context: Context) -> dict[str, Any]:
    """Host, software and device; the SageMaker job and image when the environment names them."""
    training_env: dict[str, Any] = {}
    try:
        training_env = json.loads(os.environ.get("SM_TRAINING_ENV", "{}"))
    except ValueError:
        training_env = {}
    cuda = context.device.type == "cuda"
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python_version": sys.version.split()[0],
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": str(context.device.type),
        "device_name": torch.cuda.get_device_name(context.device) if cuda else platform.processor() or None,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "world_size": context.world_size,
        "local_world_size": context.local_world_size,
        "backend": context.backend,
        "cpu_count": os.cpu_count(),
        # Set by whoever builds the job (the request builder passes the image URI through).
        "training_image": os.environ.get("TRAINING_IMAGE_URI") or None,
        "training_job": training_env.get("job_name"),
        "current_host": training_env.get("current_host"),
        "hosts": training_env.get("hosts"),
    }


def describe(
    args: argparse.Namespace,
    context: Context,
    dataset_version: str,
    classes: list[str],
    *,
    train_set: SegmentationDataset,
    val_set: SegmentationDataset,
    loader: DataLoader[Any],
    state: RunState,
) -> dict[str, Any]:
    """The run's lineage as `metrics.json` records it: data, code, host, configuration, start."""
    described: dict[str, Any] = {
        "dataset_version": dataset_version,
        "code_sha256": code_sha256(),
        "torch_version": torch.__version__,
        "host": host_info(context),
        "seed": args.seed,
        "config": dict(vars(args)),
        "classes": classes,
        "train_images": len(train_set),
        "val_images": len(val_set),
        "init_from": state.init_from,
        "warm_start": state.warm_start,
        "resumed_from": state.resumed_from,
        "loader": {
            "decoder": train_set.decoder.name,
            "workers": loader.num_workers,
            "prefetch_factor": loader.prefetch_factor,
            "pin_memory": loader.pin_memory,
        },
    }
    if not args.verify_checksums:
        described["checksums"] = checksums.disabled_report(args.max_checksum_mismatch_fraction)
    return described
