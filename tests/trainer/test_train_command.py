"""`retrain train` runs the trainer as the SageMaker job would, on a folder or a manifest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer

from retrain.commands.train import (
    image_size,
    resolve_manifest,
    trainer_command,
    trainer_environment,
)
from retrain.synth import write_scenes


def test_a_data_folder_means_its_newest_manifest(tmp_path: Path) -> None:
    write_scenes(tmp_path, count=2, size=(64, 32), seed=0, version="older")
    write_scenes(tmp_path, count=2, size=(64, 32), seed=0, version="newer")
    older = tmp_path / "manifests" / "older.jsonl"
    os.utime(older, (1, 1))
    data_dir, manifest = resolve_manifest(tmp_path, None)
    assert data_dir == tmp_path.resolve() and manifest.name == "newer.jsonl"
    assert resolve_manifest(tmp_path, "manifests/older.jsonl")[1] == older.resolve()


def test_a_manifest_file_names_its_own_data_folder(tmp_path: Path) -> None:
    write_scenes(tmp_path, count=2, size=(64, 32), seed=0, version="v1")
    data_dir, manifest = resolve_manifest(tmp_path / "manifests" / "v1.jsonl", None)
    assert data_dir == tmp_path.resolve() and manifest.name == "v1.jsonl"
    assert image_size(data_dir, manifest) == "64x32", "the default crop is the image size"


def test_a_folder_without_manifests_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match="retrain synth"):
        resolve_manifest(tmp_path, None)


def test_the_trainer_runs_under_torchrun_with_the_container_folders(tmp_path: Path) -> None:
    manifest = tmp_path / "data" / "manifests" / "v1.jsonl"
    argv = trainer_command(
        nproc=3,
        data_dir=tmp_path / "data",
        manifest=manifest,
        out=tmp_path / "out",
        trainer_args=["--epochs", "2"],
    )
    joined = " ".join(argv)
    assert "torch.distributed.run --standalone --nproc-per-node 3 -m trainer.train" in joined
    assert f"--manifest {Path('manifests') / 'v1.jsonl'}" in joined
    assert argv[-2:] == ["--epochs", "2"], "flags for the trainer go last, unchanged"

    env = trainer_environment(tmp_path / "out", tmp_path / "data")
    assert env["SM_CHANNEL_TRAIN"] == str(tmp_path / "data")
    assert env["SM_MODEL_DIR"] == str(tmp_path / "out" / "model")
    assert env["SM_OUTPUT_DATA_DIR"] == str(tmp_path / "out" / "output")
    assert env["OMP_NUM_THREADS"] == "1", "one thread per rank on a shared CPU"
