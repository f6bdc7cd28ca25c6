"""Checkpoints survive a crash at any moment and restore every random stream."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer import checkpoint


def test_the_newest_checkpoint_is_the_highest_step_and_partial_files_are_ignored(
    tmp_path: Path,
) -> None:
    for step in (5, 40, 12):
        checkpoint.save_atomically({"step": step}, checkpoint.checkpoint_path(tmp_path, step))
    # What a kill during torch.save leaves behind: never a checkpoint to resume from.
    (tmp_path / ".checkpoint-000000099.pt.partial").write_bytes(b"half a file")
    newest = checkpoint.newest(tmp_path)
    assert newest is not None and newest.name == "checkpoint-000000040.pt"
    assert checkpoint.load(newest) == {"step": 40}


def test_an_empty_or_missing_folder_has_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.newest(tmp_path) is None
    assert checkpoint.newest(tmp_path / "absent") is None


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in range(1, 6):
        checkpoint.save_checkpoint({"step": step}, tmp_path, step, keep=2)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["checkpoint-000000004.pt", "checkpoint-000000005.pt"]


def test_restored_rng_states_replay_the_same_numbers(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    checkpoint.save_atomically({"rng": checkpoint.rng_state()}, path)
    expected = (random.random(), np.random.rand(), torch.rand(3))

    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    # weights_only loading: nothing in a checkpoint may need arbitrary unpickling.
    checkpoint.set_rng_state(checkpoint.load(path)["rng"])
    replayed = (random.random(), np.random.rand(), torch.rand(3))
    assert replayed[0] == expected[0] and replayed[1] == expected[1]
    assert torch.equal(replayed[2], expected[2])


def test_a_file_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    checkpoint.save_atomically({"weights": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not a retrain-bisenetv2 model file"):
        checkpoint.load_model_document(path)
