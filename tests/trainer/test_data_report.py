"""The report's "New data" section, from what screening and the comparison left (no training)."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from trainer.screening.report import moved, section

SCORES_BEFORE = {"miou": 0.30, "per_class_iou": {"road": 0.60, "sky": 0.40, "car": None}}
SCORES_AFTER = {"miou": 0.33, "per_class_iou": {"road": 0.65, "sky": 0.395, "car": 0.1}}


def _pair(image: str, verdict: str, **more: object) -> dict[str, object]:
    return {
        "image": image,
        "label": image.replace("images", "labels").replace(".jpg", ".png"),
        "verdict": verdict,
        "contradicted": verdict in {"held", "left out"},
        "excess": 0.6 if verdict == "held" else 0.0,
        "quality": 0.1 if verdict == "held" else 0.9,
        "confusion": "labelled sky where the model sees road (900 pixels)" if verdict == "held" else "",
        **more,
    }


def _screening(folder: Path, pictures: str | None = None) -> None:
    """A held batch whose worst pair is pictured (or, with `pictures` omit, named only)."""
    if pictures != "omit":
        (folder / "screening" / "berlin-02").mkdir(parents=True)
        Image.new("RGB", (8, 4), (200, 0, 0)).save(folder / "screening" / "berlin-02" / "1.png")
    picture = None if pictures == "omit" else "screening/berlin-02/1.png"
    document = {
        **({"pictures": pictures} if pictures else {}),
        "schema_version": 2,
        "model": "s3://bucket/models/runs/r/model.pt",
        "calibration": {"kind": "independent", "text": "trusted validation pairs", "pairs": 12, "pair_bar": 0.04},
        "rule": {"batch_margin": 0.3},
        "held": ["berlin-02"],
        "batches": {
            "berlin-02": {
                "team": "berlin",
                "pair_count": 4,
                "judged": 4,
                "contradicted": 4,
                "verdict": "held",
                "held": True,
                "reasons": ["labelled sky where the model sees road: 87 % of the road pixels the model sees"],
                "pairs": [_pair("images/b/1.jpg", "held", picture=picture)]
                + [_pair(f"images/b/{n}.jpg", "held") for n in (2, 3, 4)],
            },
            "zurich-01": {
                "team": "zurich",
                "pair_count": 4,
                "judged": 4,
                "contradicted": 0,
                "verdict": "ok",
                "held": False,
                "reasons": ["within"],
                "pairs": [_pair(f"images/c/{n}.jpg", "passed") for n in range(4)],
            },
        },
    }
    (folder / "screening.json").write_text(json.dumps(document))


def test_a_held_batch_is_pictured_named_and_given_its_release_command(tmp_path: Path) -> None:
    _screening(tmp_path)
    html = section(tmp_path, {"screening": {"screened": True, "held": ["berlin-02"]}})
    assert "<h2 id='new-data'>New data</h2>" in html
    assert "labelled sky where the model sees road: 87 % of the road pixels the model sees" in html
    assert html.count("data:image/png;base64,") == 1 and "labelled sky where the model sees road (900" in html
    assert "retrain data release berlin-02 --reason" in html and "retrain data purge berlin-02" in html
    assert "<h3 id='batch-zurich-01'>" not in html, "a batch that passed gets no pictures"


def test_blurred_pictures_say_they_are_blurred_and_why(tmp_path: Path) -> None:
    _screening(tmp_path, "blur")
    html = section(tmp_path, {"screening": {"screened": True, "held": ["berlin-02"]}})

    assert html.count("data:image/png;base64,") == 1
    assert "no face or number plate can be read (HeldPairPictures blur)" in html


def test_omitted_pictures_leave_the_worst_pairs_named_and_say_why(tmp_path: Path) -> None:
    _screening(tmp_path, "omit")
    html = section(tmp_path, {"screening": {"screened": True, "held": ["berlin-02"]}})

    assert "data:image" not in html and "<img" not in html
    assert "Not pictured: the images show faces and number plates" in html and "HeldPairPictures omit" in html
    assert "<li>images/b/1.jpg: held; labelled sky where the model sees road (900 pixels)" in html
    assert "retrain data release berlin-02 --reason" in html, "the held batch still says what to do"


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
