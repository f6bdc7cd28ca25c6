"""The report's "New data" section, from what screening and the comparison left (no training)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from trainer.screening.report import moved, section

SCORES_BEFORE = {"miou": 0.30, "per_class_iou": {"road": 0.60, "sky": 0.40, "car": None}}
SCORES_AFTER = {"miou": 0.33, "per_class_iou": {"road": 0.65, "sky": 0.395, "car": 0.1}}


def _screening(folder: Path) -> None:
    (folder / "screening" / "team-b").mkdir(parents=True)
    Image.new("RGB", (8, 4), (200, 0, 0)).save(folder / "screening" / "team-b" / "1.png")
    document = {
        "model": "s3://bucket/models/runs/r/model.pt",
        "calibration": "trusted pairs",
        "reference_pairs": 12,
        "reference_share": 0.05,
        "rule": {"margin": 0.15, "unfamiliar": 0.2},
        "held": ["team-b"],
        "batches": {
            "team-b": {
                "trust": "new",
                "pairs": 4,
                "share": 0.7,
                "excess": 0.65,
                "held": True,
                "above_bar": True,
                "reasons": [
                    "70.0 % of its labelled pixels contradict the accepted model",
                    "labelled sky where the model sees road: 87 % of those pixels",
                ],
                "worst_pairs": [
                    {
                        "image": "images/b/1.jpg",
                        "label": "labels/b/1.png",
                        "quality": 0.1,
                        "picture": "screening/team-b/1.png",
                    }
                ],
            },
            "team-c": {
                "trust": "new",
                "pairs": 4,
                "share": 0.05,
                "excess": 0.0,
                "held": False,
                "above_bar": False,
                "reasons": ["within"],
                "worst_pairs": [],
            },
        },
    }
    (folder / "screening.json").write_text(json.dumps(document))


def test_a_held_batch_is_pictured_named_and_given_its_release_command(tmp_path: Path) -> None:
    _screening(tmp_path)
    html = section(tmp_path, {"screening": {"screened": True, "held": ["team-b"]}})
    assert "<h2 id='new-data'>New data</h2>" in html
    assert "labelled sky where the model sees road: 87 % of those pixels" in html
    assert html.count("data:image/png;base64,") == 1 and "90.0 % of its pixels contradicted" in html
    assert "retrain data release team-b" in html and "retrain data purge team-b" in html
    assert "<h3 id='batch-team-c'>" not in html, "a batch within the bar gets no pictures"


def test_each_drops_impact_and_the_trusted_set_are_tabled(tmp_path: Path) -> None:
    evaluation = {
        "batches": {
            "team-a": {
                "trust": "trusted",
                "held": False,
                "val_pairs": 6,
                "candidate": SCORES_AFTER,
                "accepted": SCORES_BEFORE,
            },
            "team-b": {"trust": "new", "held": True, "val_pairs": 0, "candidate": None, "accepted": None},
        },
        "trusted": {"batches": ["team-a"], "pairs": 6, "candidate": SCORES_AFTER, "accepted": SCORES_BEFORE},
    }
    html = section(
        tmp_path, {"evaluation": evaluation, "screening": {"screened": False, "why": "no accepted model yet"}}
    )
    assert "Not screened: no accepted model yet." in html
    assert "road +0.050" in html and "held</td>" in html
    assert "The trusted set: 6 pairs of 1 batches" in html and "+0.030" in html


def test_a_run_without_screening_or_evaluation_has_no_section(tmp_path: Path) -> None:
    assert section(tmp_path, {}) == "" and section(tmp_path, None) == ""


def test_only_classes_that_moved_are_named_largest_first() -> None:
    assert moved(SCORES_AFTER, SCORES_BEFORE) == "road +0.050"
    assert moved(SCORES_BEFORE, SCORES_BEFORE) == "none by 0.01 or more"
    assert moved(None, SCORES_BEFORE) == "-"
