"""A run with an accepted model judges the version's new pairs first (issue 34).

Team munich's drop trains the accepted model; its validation pairs have earned trust since (the
next manifest says so), so the model is calibrated on labels it did not learn from. The next
version adds three new drops: berlin's, exported with a wrong class map (road <-> sky, building
<-> vegetation in every mask; valid files), zurich's night scenes (the model has never seen the
dark), and hamburg's day scenes with four pairs swapped. The run holds berlin with the swap
named, leaves out hamburg's four pairs and trains on the rest, does not hold zurich, never judges
munich's training pairs (the accepted model learned them), leaves pictures, and compares the
candidate with the accepted model per batch and on the trusted set. Slow: two real trainings.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from functions.common.contracts import MetricsFile
from retrain.label_errors import swap_classes
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
    """A manifest of earlier ones; "trusted-val": the validation pairs trusted, the others new."""
    lines = []
    for version, trust in parts.items():
        for line in (folder / "manifests" / f"{version}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if trust == "trusted-val":
                entry["trust"] = "trusted" if entry["split"] == "val" else "new"
            else:
                entry["trust"] = trust
            lines.append(json.dumps(entry))
    (folder / "manifests" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def _swap_some(folder: Path, version: str, count: int) -> set[str]:
    """Rewrite the first `count` labels of a drop with the wrong class map (and their pins)."""
    path = folder / "manifests" / f"{version}.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    swapped = set()
    for entry in entries[:count]:
        label = folder / entry["label"]
        array = swap_classes(np.asarray(Image.open(label)), SWAP)
        Image.fromarray(array).save(label)
        entry["label_sha256"] = hashlib.sha256(label.read_bytes()).hexdigest()
        swapped.add(entry["image"])
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return swapped


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
def second_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str, set[str]]:
    data = tmp_path_factory.mktemp("drops")
    write_scenes(data, count=96, size=SIZE, seed=1, batch="munich-01", version="a")
    write_scenes(data, count=32, size=SIZE, seed=2, batch="berlin-01", version="b", class_map=SWAP)
    write_scenes(data, count=32, size=SIZE, seed=3, batch="zurich-night", version="c", light="night")
    write_scenes(data, count=32, size=SIZE, seed=4, batch="hamburg-01", version="d")
    swapped = _swap_some(data, "d", 4)
    _manifest(data, "first", {"a": "new"})
    _manifest(data, "second", {"a": "trusted-val", "b": "new", "c": "new", "d": "new"})
    first = tmp_path_factory.mktemp("first")
    log = _train(data, first, "first", ["--epochs", "10", "--profiling", "off"])
    assert "no accepted model yet, so nothing to screen with" in log
    second = tmp_path_factory.mktemp("second")
    accepted = str(first / "model" / "model.pt")
    log = _train(data, second, "second", ["--epochs", "1", "--baseline-model", accepted, "--init-from", accepted])
    screening = json.loads((second / "output" / "screening.json").read_text())
    return second, screening, log, swapped


Run = tuple[Path, dict[str, Any], str, set[str]]


def test_the_batch_with_swapped_classes_is_held_and_the_others_are_not(second_run: Run) -> None:
    _, screening, log, _ = second_run
    batches = screening["batches"]
    assert screening["held"] == ["berlin-01"], json.dumps({n: b["reasons"] for n, b in batches.items()}, indent=1)
    assert screening["calibration"]["kind"] == "independent"
    named = {(f["labelled"], f["seen"]) for f in batches["berlin-01"]["findings"]}
    assert named <= set(SWAP.items()) and len(named) >= 2, batches["berlin-01"]["findings"]
    assert not batches["zurich-night"]["held"], batches["zurich-night"]
    assert "berlin-01: 32 pairs" in log and "HELD" in log


def test_a_quarter_swapped_drop_loses_its_bad_pairs_and_trains_on_the_rest(second_run: Run) -> None:
    _, screening, _, swapped = second_run
    hamburg = screening["batches"]["hamburg-01"]
    left_out = {p["image"] for p in hamburg["pairs"] if p["verdict"] == "left out"}
    assert hamburg["verdict"] == "pairs left out" and not hamburg["held"], hamburg["reasons"]
    assert swapped <= left_out and len(left_out - swapped) <= 1, (sorted(swapped), sorted(left_out))
    assert hamburg["pairs"][0]["image"] in swapped, "the relabel list is worst first"


def test_the_accepted_model_never_judges_the_pairs_it_learned(second_run: Run) -> None:
    _, screening, _, _ = second_run
    assert "munich-01" not in screening["batches"], "its training pairs are the model's own; its val pairs trusted"


def test_held_and_left_out_pairs_are_neither_trained_nor_validated_on(second_run: Run) -> None:
    output, screening, _, _ = second_run
    hamburg = sum(p["verdict"] == "left out" for p in screening["batches"]["hamburg-01"]["pairs"])
    metrics = MetricsFile.model_validate_json((output / "output" / "metrics.json").read_text())
    assert metrics.screening is not None and metrics.screening.held == ["berlin-01"]
    assert metrics.screening.left_out == 32 + hamburg, (metrics.screening.left_out, hamburg)
    assert metrics.evaluation is not None
    held = metrics.evaluation.batches["berlin-01"]
    assert held.held and held.candidate is None
    assert "berlin-01" not in metrics.evaluation.trained_batches
    # munich, zurich and hamburg: 96 + 32 + 32 pairs, less what was left out.
    assert metrics.train_images + metrics.val_images == 160 - (metrics.screening.left_out - 32)


def test_the_new_model_file_says_what_it_learned_from(second_run: Run) -> None:
    output, _, _, _ = second_run
    document = torch.load(output / "model" / "model.pt", weights_only=True)
    assert set(document["basis"]["batches"]) == {"munich-01", "zurich-night", "hamburg-01"}
    assert set(document["basis"]["teams"]) == {"munich", "zurich", "hamburg"}


def test_the_gate_compares_on_trusted_pairs_and_each_batch_is_scored(second_run: Run) -> None:
    output, _, _, _ = second_run
    evaluation = json.loads((output / "output" / "metrics.json").read_text())["evaluation"]
    trusted = evaluation["trusted"]
    assert trusted["batches"] == ["munich-01"] and trusted["pairs"] > 0
    assert trusted["candidate"]["miou"] > 0 and trusted["accepted"]["miou"] > 0
    for name in ("munich-01", "zurich-night", "hamburg-01"):
        scored = evaluation["batches"][name]
        assert scored["val_pairs"] > 0 and scored["candidate"] and scored["accepted"], (name, scored)


def test_the_held_batchs_worst_pairs_are_pictured(second_run: Run) -> None:
    output, screening, _, _ = second_run
    pictures = [pair["picture"] for pair in screening["batches"]["berlin-01"]["pairs"] if "picture" in pair]
    assert len(pictures) == 6 and all((output / "output" / picture).is_file() for picture in pictures)


def test_the_report_shows_the_new_data_with_pictures_and_the_release_command(second_run: Run) -> None:
    output, _, _, _ = second_run
    page = (output / "output" / "report.html").read_text()
    assert "<h2 id='new-data'>New data</h2>" in page and "<script" not in page
    assert page.count("src='data:image/png;base64,") >= 6, "the held batch's worst pairs, in the page"
    assert "retrain data release berlin-01 --reason" in page
    assert "Each drop's impact" in page and "The trusted set: " in page
