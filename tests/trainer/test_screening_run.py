"""A run with an accepted model screens the version's new batches first (issue 26).

Team A's drop trains the accepted model. The next version holds A's batch (trusted) and three
new drops: team B's exported with a wrong class map (road <-> sky, building <-> vegetation in
every mask; valid files), team C's night scenes (the model has never seen the dark), and team
D's ordinary day scenes. The run holds B alone, with the swap named, trains and validates
without it, leaves pictures of B's worst pairs, and compares the candidate with the accepted
model per batch and on the trusted set (A's validation pairs). Slow: two real trainings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from functions.common.contracts import MetricsFile
from retrain.synth import write_scenes

pytestmark = pytest.mark.slow(seconds=30)

ROOT = Path(__file__).resolve().parents[2]
SIZE = (128, 64)
SWAP = {"road": "sky", "sky": "road", "building": "vegetation", "vegetation": "building"}
TRAINING = [
    *("--width", "0.25", "--crop", "128x64", "--batch-size", "8", "--lr", "0.05", "--workers", "0"),
    *("--log-every", "0", "--checkpoint-every-seconds", "0"),
]


def _manifest(folder: Path, name: str, parts: dict[str, str]) -> None:
    lines = [
        json.dumps({**json.loads(line), "trust": trust})
        for version, trust in parts.items()
        for line in (folder / "manifests" / f"{version}.jsonl").read_text().splitlines()
    ]
    (folder / "manifests" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def _train(data: Path, out: Path, manifest: str, extra: list[str]) -> str:
    argv = [
        *(sys.executable, "-m", "trainer.train", "--data-dir", str(data), "--manifest", f"manifests/{manifest}.jsonl"),
        *("--model-dir", str(out / "model"), "--output-data-dir", str(out / "output")),
        *("--checkpoint-dir", str(out / "checkpoints"), *TRAINING, *extra),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    for name in ("SM_CHANNEL_TRAIN", "SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHANNEL_MODEL", "WORLD_SIZE"):
        env.pop(name, None)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"training failed:\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def second_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    data = tmp_path_factory.mktemp("drops")
    write_scenes(data, count=96, size=SIZE, seed=1, batch="team-a", version="a")
    write_scenes(data, count=32, size=SIZE, seed=2, batch="team-b", version="b", class_map=SWAP)
    write_scenes(data, count=32, size=SIZE, seed=3, batch="team-c-night", version="c", light="night")
    write_scenes(data, count=32, size=SIZE, seed=4, batch="team-d", version="d")
    _manifest(data, "first", {"a": "new"})
    _manifest(data, "second", {"a": "trusted", "b": "new", "c": "new", "d": "new"})
    first = tmp_path_factory.mktemp("first")
    log = _train(data, first, "first", ["--epochs", "10", "--profiling", "off"])
    assert "no accepted model yet, so nothing to screen with" in log
    second = tmp_path_factory.mktemp("second")
    accepted = str(first / "model" / "model.pt")
    log = _train(data, second, "second", ["--epochs", "1", "--baseline-model", accepted, "--init-from", accepted])
    screening = json.loads((second / "output" / "screening.json").read_text())
    return second / "output", screening, log


def test_the_batch_with_swapped_classes_is_held_and_the_others_are_not(
    second_run: tuple[Path, dict[str, Any], str],
) -> None:
    _, screening, log = second_run
    assert screening["held"] == ["team-b"], json.dumps(screening["batches"], indent=1)
    assert screening["calibration"] == "trusted pairs"
    swapped = screening["batches"]["team-b"]
    named = {(c["labelled"], c["seen"]) for c in swapped["confusions"]}
    assert named <= set(SWAP.items()) and len(named) >= 2, swapped["confusions"]
    night = screening["batches"]["team-c-night"]
    assert not night["held"], night
    assert "team-b: 32 pairs" in log and "HELD" in log


def test_the_held_batch_is_neither_trained_nor_validated_on(second_run: tuple[Path, dict[str, Any], str]) -> None:
    output, _, _ = second_run
    metrics = MetricsFile.model_validate_json((output / "metrics.json").read_text())
    assert metrics.screening is not None and metrics.screening.held == ["team-b"]
    assert metrics.evaluation is not None
    held = metrics.evaluation.batches["team-b"]
    assert held.held and held.candidate is None
    assert "team-b" not in metrics.evaluation.trained_batches
    # Teams A, C and D: 96 + 32 + 32 pairs; B's 32 are in neither split.
    assert metrics.train_images + metrics.val_images == 160, (metrics.train_images, metrics.val_images)


def test_the_gate_compares_on_trusted_pairs_and_each_batch_is_scored(
    second_run: tuple[Path, dict[str, Any], str],
) -> None:
    output, _, _ = second_run
    evaluation = json.loads((output / "metrics.json").read_text())["evaluation"]
    trusted = evaluation["trusted"]
    assert trusted["batches"] == ["team-a"] and trusted["pairs"] > 0
    assert trusted["candidate"]["miou"] > 0 and trusted["accepted"]["miou"] > 0
    for name in ("team-a", "team-c-night", "team-d"):
        scored = evaluation["batches"][name]
        assert scored["val_pairs"] > 0 and scored["candidate"] and scored["accepted"], (name, scored)


def test_the_held_batchs_worst_pairs_are_pictured(second_run: tuple[Path, dict[str, Any], str]) -> None:
    output, screening, _ = second_run
    pictures = [pair["picture"] for pair in screening["batches"]["team-b"]["worst_pairs"]]
    assert len(pictures) == 3 and all((output / picture).is_file() for picture in pictures)
    assert not any("picture" in pair for pair in screening["batches"]["team-d"]["worst_pairs"])


def test_the_report_shows_the_new_data_with_pictures_and_the_release_command(
    second_run: tuple[Path, dict[str, Any], str],
) -> None:
    output, _, _ = second_run
    page = (output / "report.html").read_text()
    assert "<h2 id='new-data'>New data</h2>" in page and "<script" not in page
    assert page.count("src='data:image/png;base64,") == 3, "the held batch's three worst pairs, in the page"
    assert "retrain data release team-b" in page
    assert "Each drop's impact" in page and "The trusted set: " in page
