"""The trainer checks every file it reads against the manifest's sha256: FSx presents the newest
bytes of each S3 key, the dataset version pins older ones. A pair that differs is skipped, counted
over loader workers and ranks, named in metrics.json, and fails the run above the tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from functions.common.contracts import MetricsFile
from retrain.synth import default_version, write_scenes
from trainer import build, checksums
from trainer.data import IGNORE_INDEX, Augment, SegmentationDataset, read_manifest
from trainer.loader import make_loader
from trainer.model import SegmentationLoss
from trainer.train import get_args_parser

ROOT = Path(__file__).resolve().parents[2]
COUNT, SIZE, SEED = 48, (64, 32), 1
WRONG = "0" * 64
TINY_RUN = [
    "--width",
    "0.25",
    "--crop",
    "64x32",
    "--batch-size",
    "4",
    "--epochs",
    "2",
    "--workers",
    "0",
    "--log-every",
    "0",
    "--checkpoint-every-seconds",
    "0",
    "--profiling",
    "off",
]


def _scenes(root: Path) -> Path:
    """`retrain synth`'s scenes and manifest (which pins real sha256s); the manifest's path."""
    write_scenes(root, count=COUNT, size=SIZE, seed=SEED)
    return root / "manifests" / f"{default_version(SEED, COUNT, SIZE)}.jsonl"


def _lines(manifest: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def _write(manifest: Path, lines: list[dict[str, Any]]) -> None:
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _first(lines: list[dict[str, Any]], split: str) -> int:
    return next(number for number, line in enumerate(lines) if line["split"] == split)


def _collect(dataset: SegmentationDataset, max_fraction: float) -> checksums.Verdict:
    found = checksums.collect_splits({"train": dataset}, torch.device("cpu"), max_fraction)
    assert found is not None
    return found


def _overwrite_image(root: Path, line: dict[str, Any]) -> None:
    """What FSx shows once the S3 key was overwritten: a valid image, not the pinned bytes."""
    path = root / line["image"]
    Image.open(path).convert("RGB").rotate(180).save(path, format="JPEG", quality=80)


# --------------------------------------------------------------- in the loader workers --
def test_synth_pins_the_very_bytes_it_writes_and_every_pair_checks(tmp_path: Path) -> None:
    entries = read_manifest(_scenes(tmp_path))
    dataset = SegmentationDataset(tmp_path, entries, Augment(crop=(48, 24)), verify=True)
    loader = make_loader(
        dataset,
        batch_size=4,
        sampler=[(index, index) for index in range(len(entries))],
        workers=2,
        pin_memory=False,
    )
    labels = torch.cat([batch for _, batch in loader])
    assert labels.ne(IGNORE_INDEX).any(dim=(1, 2)).all(), "a pinned pair must not be skipped"
    found = _collect(dataset, 0.0)
    # Both worker processes wrote their verdicts where the training process reads them.
    assert [(s.pairs, s.checked, s.mismatched) for s in found.splits] == [(COUNT, COUNT, 0)]
    assert not found.failed and found.report()["train"]["files"] == []


def test_a_pair_that_differs_is_counted_named_and_skipped_without_being_decoded(tmp_path: Path) -> None:
    manifest = _scenes(tmp_path)
    lines = _lines(manifest)
    lines[3]["label_sha256"] = WRONG
    _write(manifest, lines)
    _overwrite_image(tmp_path, lines[5])
    entries = read_manifest(manifest)
    dataset = SegmentationDataset(tmp_path, entries, Augment(crop=(48, 24)), verify=True)
    for index in range(len(entries)):
        image, label = dataset[(index, index)]
        skipped = index in {3, 5}
        assert (label.eq(IGNORE_INDEX).all() and image.eq(0).all()) == skipped, index
        assert image.shape == (3, 24, 48) and label.shape == (24, 48)

    found = _collect(dataset, 0.04)
    [split] = found.splits
    assert (split.mismatched, split.checked) == (2, COUNT)
    assert split.files == [(lines[3]["label"], WRONG), (lines[5]["image"], lines[5]["image_sha256"])]
    assert found.failed, f"2/{COUNT} is above 4%"
    assert lines[3]["label"] in found.message() and "--max-checksum-mismatch-fraction 0.04" in found.message()
    assert not _collect(dataset, 0.05).failed


def test_without_a_crop_a_skipped_pair_keeps_the_size_of_its_batch(tmp_path: Path) -> None:
    manifest = _scenes(tmp_path)
    lines = _lines(manifest)
    lines[0]["image_sha256"] = WRONG
    _write(manifest, lines)
    dataset = SegmentationDataset(tmp_path, read_manifest(manifest), verify=True)
    image, label = dataset[0]
    assert image.shape == (3, SIZE[1], SIZE[0]) and label.eq(IGNORE_INDEX).all()


def test_a_batch_of_skipped_pairs_adds_zero_loss_not_nan() -> None:
    logits = [torch.randn(2, 19, 8, 8, requires_grad=True) for _ in range(2)]
    labels = torch.full((2, 8, 8), IGNORE_INDEX)
    loss = SegmentationLoss(aux_weight=1.0, class_weights=[1.0] * 19)(logits, labels)
    loss.backward()
    assert float(loss.detach()) == 0.0 and all(bool(t.grad is not None and t.grad.eq(0).all()) for t in logits)
    labels[0, 0, 0] = 3
    assert float(SegmentationLoss(aux_weight=1.0)(logits, labels).detach()) > 0


# ------------------------------------------------------------------------- the flags --
def test_a_manifest_without_digests_is_refused_unless_the_check_is_off(tmp_path: Path) -> None:
    manifest = _scenes(tmp_path)
    lines = _lines(manifest)
    del lines[7]["label_sha256"]
    _write(manifest, lines)
    argv = ["--data-dir", str(tmp_path), "--manifest", str(manifest)]
    with pytest.raises(SystemExit, match=r"1 of 48 pairs .* no image_sha256 or label_sha256.*--verify-checksums false"):
        build.datasets(get_args_parser().parse_args(argv), manifest)
    train_set, val_set = build.datasets(get_args_parser().parse_args([*argv, "--verify-checksums", "false"]), manifest)
    assert train_set.checksums is None and val_set.checksums is None


def test_the_check_is_on_and_strict_by_default_and_the_tolerance_is_a_fraction() -> None:
    args = get_args_parser().parse_args([])
    assert args.verify_checksums is True and args.max_checksum_mismatch_fraction == 0.0
    args = get_args_parser().parse_args(["--data-dir", "d", "--model-dir", "m", "--output-data-dir", "o"])
    args.max_checksum_mismatch_fraction = 1.5
    with pytest.raises(SystemExit, match="--max-checksum-mismatch-fraction"):
        build.check_args(args)


def test_metrics_files_from_before_the_check_still_parse() -> None:
    older = {
        "dataset_version": "v1",
        "code_sha256": "a" * 64,
        "torch_version": "2",
        "host": {"hostname": "h", "platform": "p", "python_version": "3", "torch_version": "2", "device": "cpu"}
        | {"world_size": 1, "backend": "gloo"},
        "seed": 0,
        "config": {},
        "classes": ["road"],
        "train_images": 1,
        "val_images": 1,
        "epochs": [],
    }
    assert MetricsFile.model_validate(older).checksums is None
    off = MetricsFile.model_validate(older | {"checksums": checksums.disabled_report(0.0)}).checksums
    assert off is not None and not off.enabled and off.train is None


# ------------------------------------------------------------- real runs, two ranks --
def _train(data: Path, manifest: Path, out: Path, extra: list[str], nproc: int = 2) -> tuple[int, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    for name in ("SM_CHANNEL_TRAIN", "SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHANNEL_MODEL", "RETRAIN_PROFILING"):
        env.pop(name, None)
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] if nproc > 1 else []
    argv = [
        sys.executable,
        *launcher,
        "-m",
        "trainer.train",
        "--data-dir",
        str(data),
        "--manifest",
        str(manifest),
        "--model-dir",
        str(out / "model"),
        "--output-data-dir",
        str(out / "output"),
        "--checkpoint-dir",
        str(out / "checkpoints"),
        *TINY_RUN,
        *extra,
    ]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


def _metrics(out: Path) -> MetricsFile:
    return MetricsFile.model_validate_json((out / "output" / "metrics.json").read_text())


@pytest.mark.slow(seconds=5)
def test_a_label_that_differs_from_the_manifest_fails_the_run_naming_it(tmp_path: Path) -> None:
    manifest = _scenes(tmp_path / "scenes")
    lines = _lines(manifest)
    bad = _first(lines, "val")
    lines[bad]["label_sha256"] = WRONG
    _write(manifest, lines)

    code, log = _train(tmp_path / "scenes", manifest, tmp_path / "out", [])
    assert code != 0, log[-3000:]
    assert "checksums: val: 1 of 12 pairs (8.3%) do not match the manifest's sha256" in log, log[-3000:]
    assert f"{lines[bad]['label']} (pinned sha256 {WRONG[:12]})" in log
    assert "above --max-checksum-mismatch-fraction 0" in log
    report = _metrics(tmp_path / "out").checksums
    assert report is not None and report.enabled and report.failed
    assert report.val is not None and report.val.mismatched == 1 and report.val.checked == 12
    assert [(f.path, f.expected_sha256) for f in report.val.files] == [(lines[bad]["label"], WRONG)]
    assert report.train is not None and report.train.mismatched == 0
    assert not (tmp_path / "out" / "model" / "model.pt").exists(), "a failed run leaves no model"


@pytest.mark.slow(seconds=5)
def test_within_the_tolerance_the_run_completes_and_records_what_it_skipped(tmp_path: Path) -> None:
    scenes = tmp_path / "scenes"
    manifest = _scenes(scenes)
    lines = _lines(manifest)
    lines[_first(lines, "val")]["label_sha256"] = WRONG
    _write(manifest, lines)
    changed = _first(lines, "train")
    _overwrite_image(scenes, lines[changed])

    # Loader worker processes do the reading and hashing: their verdicts reach the trainer.
    code, log = _train(
        scenes, manifest, tmp_path / "out", ["--max-checksum-mismatch-fraction", "0.1", "--workers", "2"]
    )
    assert code == 0, log[-3000:]
    assert "Within --max-checksum-mismatch-fraction 0.1: those pairs are skipped" in log
    metrics = _metrics(tmp_path / "out")
    assert metrics.complete and metrics.checksums is not None and not metrics.checksums.failed
    train, val = metrics.checksums.train, metrics.checksums.val
    assert train is not None and val is not None
    assert (val.mismatched, val.checked, val.pairs) == (1, 12, 12)
    # Read on one rank or the other: the all-reduce counts it once.
    assert train.mismatched == 1 and [f.path for f in train.files] == [lines[changed]["image"]]
    assert train.fraction == pytest.approx(1 / 36, abs=1e-6)


@pytest.mark.slow(seconds=5)
def test_a_manifest_that_pins_what_is_on_disk_reports_no_mismatch(tmp_path: Path) -> None:
    manifest = _scenes(tmp_path / "scenes")
    code, log = _train(tmp_path / "scenes", manifest, tmp_path / "out", ["--epochs", "1"], nproc=1)
    assert code == 0, log[-3000:]
    report = _metrics(tmp_path / "out").checksums
    assert report is not None and report.enabled and not report.failed
    assert report.train is not None and report.val is not None
    assert (report.train.mismatched, report.val.mismatched) == (0, 0)
    assert report.val.checked == 12 and report.train.checked > 0
    assert "checksums:" not in log
