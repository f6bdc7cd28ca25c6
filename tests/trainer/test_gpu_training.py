"""On a GPU host the trainer takes its GPU paths: NCCL, autocast, channels-last, SyncBatchNorm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from functions.common.contracts import MetricsFile
from retrain.synth import default_version, write_scenes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow(seconds=120),  # an estimate: not measured here (no CUDA device)
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_a_gpu_run_uses_nccl_mixed_precision_and_loader_workers(tmp_path: Path) -> None:
    write_scenes(tmp_path / "scenes", count=48, size=(128, 64), seed=2)
    version = default_version(2, 48, (128, 64))
    nproc = min(2, torch.cuda.device_count())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "trainer.train",
        "--data-dir",
        str(tmp_path / "scenes"),
        "--dataset-version",
        version,
        "--model-dir",
        str(tmp_path / "model"),
        "--output-data-dir",
        str(tmp_path / "output"),
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--width",
        "0.25",
        "--crop",
        "128x64",
        "--epochs",
        "2",
        "--batch-size",
        "4",
        "--workers",
        "2",
        "--amp",
        "true",
        "--channels-last",
        "true",
        "--sync-bn",
        "true",
        "--checkpoint-every-steps",
        "2",
    ]
    result = subprocess.run(  # noqa: PLW1510 (the return code is asserted below)
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"GPU run failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    metrics = MetricsFile.model_validate_json((tmp_path / "output" / "metrics.json").read_text())
    assert metrics.host.device == "cuda" and metrics.host.backend == "nccl"
    assert len(metrics.epochs) == 2 and metrics.complete
