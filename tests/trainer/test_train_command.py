"""`retrain train` runs the trainer as the SageMaker job would, on a folder or a manifest."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from functions.common.contracts import MetricsFile
from retrain.commands import train as train_command
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


# A trainer that does at once what `trainer.train` does in minutes: a few log lines, a METRIC
# line per epoch, model.pt and metrics.json where the container's folders are.
FAKE_TRAINER = """
import sys
from pathlib import Path
out, metrics = Path(sys.argv[1]), sys.argv[2]
print("loading the manifest", flush=True)
print("METRIC epoch=1 train_loss=1.0 miou=0.5", flush=True)
print("METRIC epoch=2 train_loss=0.5 miou=0.75", flush=True)
(out / "model" / "model.pt").write_bytes(b"weights")
(out / "output" / "metrics.json").write_text(metrics)
"""


def _metrics(dataset_version: str) -> MetricsFile:
    epochs = [
        {
            "epoch": number,
            "train_loss": loss,
            "lr": 0.1,
            "miou": miou,
            "per_class_iou": {"road": miou, "sky": None},
            "stall_fraction": 0.0,
            "images_per_sec": 10.0,
            "epoch_seconds": 1.0,
            "steps": 2,
        }
        for number, loss, miou in ((1, 1.0, 0.5), (2, 0.5, 0.75))
    ]
    host = {
        "hostname": "here",
        "platform": "linux",
        "python_version": "3.11",
        "torch_version": "2",
        "device": "cpu",
        "world_size": 2,
        "backend": "gloo",
    }
    return MetricsFile.model_validate(
        {
            "dataset_version": dataset_version,
            "code_sha256": "0" * 64,
            "torch_version": "2",
            "host": host,
            "seed": 0,
            "config": {},
            "classes": ["road", "sky"],
            "train_images": 3,
            "val_images": 1,
            "epochs": epochs,
            "miou": 0.75,
            "per_class_iou": {"road": 0.75, "sky": None},
            "complete": True,
        }
    )


def test_train_json_is_the_finished_run_and_stdout_carries_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_scenes(tmp_path / "data", count=4, size=(64, 32), seed=0, version="v1")
    out = tmp_path / "out"
    metrics = _metrics("v1")

    def fake(*, out: Path, **_: object) -> list[str]:
        return [sys.executable, "-c", FAKE_TRAINER, str(out), metrics.model_dump_json()]

    monkeypatch.setattr(train_command, "trainer_command", fake)
    app = typer.Typer()
    app.command(context_settings=train_command.CONTEXT_SETTINGS)(train_command.command)

    result = CliRunner().invoke(app, [str(tmp_path / "data"), "--out", str(out), "--epochs", "2", "--json"])

    assert result.exit_code == 0, result.output
    trained = json.loads(result.stdout)
    resolved = out.resolve()
    assert (trained["out"], trained["model"], trained["metrics_file"], trained["log"]) == (
        str(resolved),
        str(resolved / "model" / "model.pt"),
        str(resolved / "output" / "metrics.json"),
        str(resolved / "logs" / "train.log"),
    )
    assert trained["manifest"] == str((tmp_path / "data" / "manifests" / "v1.jsonl").resolve())
    assert (trained["dataset_version"], trained["processes"], trained["left_out"]) == ("v1", 2, [])
    assert MetricsFile.model_validate(trained["metrics"]) == metrics
    assert "METRIC epoch=2" in result.stderr and "METRIC" not in result.stdout, "the progress goes to stderr"
    assert "METRIC epoch=2" in (out / "logs" / "train.log").read_text()
