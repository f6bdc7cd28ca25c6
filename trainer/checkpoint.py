"""Resumable checkpoints and the model file: written atomically, loaded without unpickling code.

A checkpoint holds everything a restarted job (a spot interruption) needs to continue as if it had
never stopped: model, optimizer, scheduler, scaler, epoch and step within the epoch (hence the
sampler position), the epoch history so far, and every rank's RNG state. SageMaker syncs the
checkpoint folder to S3 while the job runs and restores it on restart; files are written beside
their final name and renamed, so neither a reader nor that sync ever sees half a checkpoint.

Everything saved is plain tensors, numbers, strings and containers, so both files load with
`torch.load(weights_only=True)`: a model or checkpoint from S3 cannot run code on load.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d{9})\.pt$")
MODEL_FORMAT = "retrain-bisenetv2"
MODEL_FILE = "model.pt"


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
    document = torch.load(path, map_location="cpu", weights_only=True)
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
    state_dict: dict[str, torch.Tensor], *, width: float, classes: list[str]
) -> dict[str, Any]:
    """The model file: inference weights (no booster heads) and what it takes to rebuild the net."""
    return {
        "format": MODEL_FORMAT,
        "version": 1,
        "architecture": "bisenetv2",
        "width": width,
        "classes": list(classes),
        "state_dict": {k: v for k, v in state_dict.items() if not k.startswith("aux_heads.")},
    }


def load_model_document(path: Path) -> dict[str, Any]:
    """A model file written by `model_document`, checked to be one."""
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    document = load(path)
    if document.get("format") != MODEL_FORMAT:
        raise ValueError(
            f"{path} is not a {MODEL_FORMAT} model file (format {document.get('format')!r})"
        )
    return document
