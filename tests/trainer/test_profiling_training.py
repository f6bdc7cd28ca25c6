"""A real training run profiles itself: per-rank steps, host samples, rules.json, report.html;
and a rule configured to stop the run stops every rank cleanly, saying which rule it was.

Real torchrun runs with two gloo processes on CPU: slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from functions.common.contracts import MetricsFile
from functions.common.rules import parse_rules_file
from retrain.synth import default_version, write_scenes

pytestmark = pytest.mark.slow(seconds=5)  # the longest test here, on 2 cores

ROOT = Path(__file__).resolve().parents[2]
COUNT, SIZE, SEED = 48, (64, 32), 1
TINY_RUN = [
    "--width",
    "0.25",
    "--crop",
    "64x32",
    "--batch-size",
    "4",
    "--lr",
    "0.1",
    "--workers",
    "0",
    "--log-every",
    "0",
    "--checkpoint-every-seconds",
    "0",
    "--profiling-interval-ms",
    "100",
]


def _train(tmp_path: Path, extra: list[str]) -> tuple[Path, str]:
    scenes = tmp_path / "scenes"
    if not scenes.exists():
        write_scenes(scenes, count=COUNT, size=SIZE, seed=SEED)
    manifest = f"manifests/{default_version(SEED, COUNT, SIZE)}.jsonl"
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    for name in (
        "SM_CHANNEL_TRAIN",
        "SM_MODEL_DIR",
        "SM_OUTPUT_DATA_DIR",
        "SM_CHANNEL_MODEL",
        "RETRAIN_PROFILING",
        "RETRAIN_PROFILING_INTERVAL_MS",
    ):
        env.pop(name, None)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "trainer.train",
        "--data-dir",
        str(scenes),
        "--manifest",
        manifest,
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
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"training failed:\n{log[-4000:]}"
    return out / "output", log


def test_a_training_run_leaves_its_profile_rules_and_report(tmp_path: Path) -> None:
    output, _ = _train(tmp_path, ["--epochs", "2"])
    lines = [json.loads(line) for line in (output / "profile/steps/rank1.jsonl").read_text().splitlines()]
    steps = [s for s in lines if s["phase"] == "TRAIN"]
    assert len(steps) == 2 * 4, lines[:2]
    assert all(s["loss"] is not None and s["duration"] > 0 for s in steps)
    # Each epoch's validation pass: its batches are EVAL steps, without a loss.
    evaluation = [s for s in lines if s["phase"] == "EVAL"]
    assert {s["epoch"] for s in evaluation} == {0, 1} and all("loss" not in s for s in evaluation), lines
    assert len(evaluation) + len(steps) == len(lines)
    assert (output / "profile/steps/rank0.jsonl").exists()
    [system] = list((output / "profile/system").glob("*.jsonl"))
    assert system.read_text().count("CPUUtilization") > 0
    parsed = parse_rules_file((output / "rules.json").read_text())
    assert parsed.backend == "builtin" and len(parsed.rules) == 12
    assert not [r.name for r in parsed.rules if r.status == "Error"], parsed.rules
    page = (output / "report.html").read_text()
    assert "<script" not in page and "DataStall" in page and "validation mIoU" in page
    assert "Validation passes" in page and "No validation steps recorded" not in page
    MetricsFile.model_validate_json((output / "metrics.json").read_text())


def test_a_stopping_rule_stops_every_rank_and_the_results_name_it(tmp_path: Path) -> None:
    # Any stall at all is too much here, so DataStall fires at its first evaluation.
    overrides = json.dumps({"DataStall": {"threshold": 0.0, "patience": 2, "window": 2}})
    output, log = _train(
        tmp_path,
        [
            "--epochs",
            "20",
            "--stop-on-rule",
            "DataStall",
            "--rules-every-seconds",
            "0.5",
            "--rule-parameters",
            overrides,
        ],
    )
    metrics = MetricsFile.model_validate_json((output / "metrics.json").read_text())
    assert metrics.model_extra and metrics.model_extra.get("stopped_by_rule") == "DataStall"
    assert len(metrics.epochs) < 20, "the run went on to the end"
    assert metrics.complete
    stall = next(r for r in parse_rules_file((output / "rules.json").read_text()).rules if r.name == "DataStall")
    assert stall.status == "IssuesFound" and stall.evidence.get("stopped_training") is True
    assert "stopped the run" in log
