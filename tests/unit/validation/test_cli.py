"""An annotator checks a folder before uploading it: `retrain validate DIR`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from retrain.cli import app as retrain_app
from retrain.commands.validate import validate

from .corpus import encode, jpeg, mask

runner = CliRunner()
app = typer.Typer()
app.command()(validate)

REQUIRED = {"item", "image", "label", "status", "reasons"}


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def good(stem: str) -> dict[str, bytes]:
    return {f"images/{stem}.jpg": jpeg(), f"labels/{stem}.png": mask()}


def test_a_clean_batch_exits_0_with_a_summary(tmp_path: Path) -> None:
    batch = folder(
        tmp_path,
        {
            **good("rue de la paix"),
            "images/b+c.png": encode(Image.new("L", (64, 32), 9), "PNG"),
            "labels/b+c.png": mask(),
        },
    )

    result = runner.invoke(app, [str(batch)])

    assert result.exit_code == 0, result.output
    assert "2 items: 2 valid, 0 invalid, 0 incomplete, 0 duplicate" in result.stdout


def test_a_batch_with_defects_exits_1_and_tables_every_reason(tmp_path: Path) -> None:
    batch = folder(
        tmp_path,
        {
            **good("ok"),
            "images/cut.jpg": jpeg()[:300],
            "labels/cut.png": mask(),
            "images/alone.jpg": jpeg(size=(64, 40)),
            "labels/[red]odd.png": mask(regions={42: 2}),
            "images/[red]odd.jpg": jpeg(size=(64, 48)),
        },
    )

    result = runner.invoke(app, [str(batch)])

    assert result.exit_code == 1
    for shown in (
        "image_truncated",
        "missing_label",
        "mask_unknown_class",
        "[red]odd",
        "incomplete",
    ):
        assert shown in result.stdout
    assert "4 items: 1 valid, 2 invalid, 1 incomplete, 0 duplicate" in result.stdout


def test_json_output_is_one_object_per_item(tmp_path: Path) -> None:
    photo = jpeg(size=(64, 40))
    batch = folder(
        tmp_path,
        {
            **good("a"),
            "images/b.jpg": photo,
            "labels/b.png": mask(size=(64, 40)),
            "images/c.jpg": photo,
            "labels/c.png": mask(size=(64, 40)),
            "labels/d.png": mask(),
            "notes.txt": b"todo",
        },
    )

    result = runner.invoke(app, [str(batch), "--json"])

    assert result.exit_code == 1
    lines = [json.loads(text) for text in result.stdout.splitlines()]
    assert all(set(line) >= REQUIRED for line in lines)
    assert {line["item"]: line["status"] for line in lines} == {
        "a": "valid",
        "b": "valid",
        "c": "duplicate",
        "d": "incomplete",
        "notes.txt": "invalid",
    }
    by_item = {line["item"]: line for line in lines}
    assert by_item["c"]["reasons"][0]["code"] == "duplicate_image"
    assert by_item["a"]["class_pixels"] == {"road": 52 * 32, "sky": 8 * 32, "car": 4 * 32}


def test_a_file_name_that_is_not_utf8_is_reported_not_crashed_on(tmp_path: Path) -> None:
    batch = folder(tmp_path, good("a"))
    (batch / "images").joinpath(b"caf\xe9.jpg".decode("utf-8", "surrogateescape")).write_bytes(jpeg())

    result = runner.invoke(app, [str(batch), "--json"])

    assert result.exit_code == 1
    lines = [json.loads(text) for text in result.stdout.splitlines()]
    assert [line["reasons"][0]["code"] for line in lines if line["status"] != "valid"] == ["unsafe_name"]


@pytest.mark.parametrize(
    "arguments",
    [
        ["{missing}"],
        ["{empty}"],
        ["{batch}", "--format", "coco"],
        ["{batch}", "--config", "{bad_config}"],
        ["{batch}", "--format", "groundtruth"],
        ["{batch}", "--allow-source", "http://not-s3/"],
        ["{only_images}"],
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, arguments: list[str]) -> None:
    places = {
        "missing": tmp_path / "nope",
        "empty": folder(tmp_path / "empty", {"readme.txt": b"x"}),
        "batch": folder(tmp_path / "batch", good("a")),
        "bad_config": folder(tmp_path / "cfg", {"config.json": b'{"max_pixels": -1}'}) / "config.json",
        "only_images": (tmp_path / "only" / "images"),
    }
    places["only_images"].mkdir(parents=True)

    result = runner.invoke(app, [argument.format(**places) for argument in arguments])

    assert result.exit_code == 2, result.output


def test_a_config_file_changes_the_bounds(tmp_path: Path) -> None:
    batch = folder(tmp_path / "batch", good("a"))
    config = folder(tmp_path / "cfg", {"c.json": b'{"max_width": 48}'}) / "c.json"

    result = runner.invoke(app, [str(batch), "--config", str(config), "--json"])

    assert result.exit_code == 1
    assert json.loads(result.stdout)["reasons"][0]["code"] == "image_too_large"


def test_a_ground_truth_manifest_is_read_from_a_local_mirror(tmp_path: Path) -> None:
    color_map = {
        "0": {"class-name": "BACKGROUND", "hex-color": "#ffffff"},
        "1": {"class-name": "road", "hex-color": "#804080"},
    }
    mask_png = Image.new("RGB", (64, 32), (255, 255, 255))
    mask_png.paste((0x80, 0x40, 0x80), (0, 0, 10, 32))
    mirror = folder(
        tmp_path / "mirror",
        {"labels-bucket/raw/a.jpg": jpeg(), "labels-bucket/out/a.png": encode(mask_png, "PNG")},
    )
    entry = {
        "source-ref": "s3://labels-bucket/raw/a.jpg",
        "job-ref": "s3://labels-bucket/out/a.png",
        "job-ref-metadata": {
            "internal-color-map": color_map,
            "type": "groundtruth/semantic-segmentation",
        },
    }
    manifests = folder(tmp_path / "manifests", {"output.manifest": json.dumps(entry).encode() + b"\n"})

    allowed = [
        "--allow-source",
        "s3://labels-bucket/raw/",
        "--allow-source",
        "s3://labels-bucket/out/",
    ]
    ok = runner.invoke(
        app,
        [
            str(manifests),
            "--format",
            "groundtruth",
            "--source-root",
            str(mirror),
            *allowed,
            "--json",
        ],
    )
    refused = runner.invoke(
        app,
        [
            str(manifests / "output.manifest"),
            "--format",
            "groundtruth",
            "--source-root",
            str(mirror),
        ],
    )

    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["class_pixels"] == {"road": 320}
    assert refused.exit_code == 1
    assert "source_not_allowed" in refused.stdout


def test_a_manifest_with_bytes_that_are_not_utf8_is_reported_not_crashed_on(
    tmp_path: Path,
) -> None:
    entry = {
        "source-ref": "s3://bkt/raw/PLACEHOLDER.jpg",
        "job-ref": "s3://bkt/out/a.png",
        "job-ref-metadata": {
            "internal-color-map": {"0": {"class-name": "road", "hex-color": "#804080"}},
            "type": "groundtruth/semantic-segmentation",
        },
    }
    text = json.dumps(entry).encode().replace(b"PLACEHOLDER", b"caf\xe9")
    manifest = folder(tmp_path, {"x.manifest": text})

    result = runner.invoke(app, [str(manifest), "--format", "groundtruth", "--allow-source", "s3://bkt/", "--json"])

    assert result.exit_code == 1
    line = json.loads(result.stdout)
    assert line["image"] == "s3://bkt/raw/caf\\udce9.jpg"
    assert line["reasons"][0]["code"] == "unsafe_name"


def test_the_retrain_tool_offers_the_command() -> None:
    result = runner.invoke(retrain_app, ["validate", "--help"])

    assert result.exit_code == 0
    assert "--format" in result.stdout


def test_a_synth_folder_is_valid_its_manifests_left_out_with_a_note(tmp_path: Path) -> None:
    scenes = tmp_path / "scenes"
    made = runner.invoke(retrain_app, ["synth", str(scenes), "--count", "6", "--size", "64x32"])
    assert made.exit_code == 0, made.output
    assert any((scenes / "manifests").glob("*.jsonl"))
    result = runner.invoke(retrain_app, ["validate", str(scenes), "--json"])
    assert result.exit_code == 0, result.output
    items = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(items) == 6
    assert all(item["status"] == "valid" for item in items)
    assert "not checked: 1 manifest(s) in manifests/" in result.stderr


def test_other_files_under_manifests_are_still_unexpected(tmp_path: Path) -> None:
    batch = folder(tmp_path, {**good("a"), "manifests/v1.jsonl": b"{}\n", "manifests/notes.txt": b"x"})
    result = runner.invoke(retrain_app, ["validate", str(batch), "--json"])
    assert result.exit_code == 1
    reasons = {
        item["item"]: [r["code"] for r in item["reasons"]] for item in map(json.loads, result.stdout.splitlines())
    }
    assert reasons == {"a": [], "manifests/notes.txt": ["unexpected_file"]}
