"""`retrain train DIR` on a plain labeled folder: validated as the intake would, frozen into
OUT/manifest.jsonl as the trigger would, what the intake would quarantine listed and left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from functions.common.contracts import MetricsFile, dump_manifest, parse_manifest
from retrain import labeled
from retrain.commands import train as train_command
from retrain.synth import write_scenes
from tests.unit.test_labeled_manifest import BROKEN, COUNT, SIZE, plain_folder
from trainer.data import read_manifest


def invoke(*args: str) -> Result:
    app = typer.Typer()
    app.command(context_settings=train_command.CONTEXT_SETTINGS)(train_command.command)
    return CliRunner().invoke(app, list(args))


def words(result: Result) -> str:
    """The output with table borders and line wrapping taken out."""
    text = result.output
    for border in "│╭╮╰╯─┃━┏┓┗┛┡┩╇┳┻╋":
        text = text.replace(border, " ")
    return " ".join(text.split())


@pytest.mark.slow(seconds=5)
def test_a_labeled_folder_trains_without_its_broken_pair(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    out = tmp_path / "out"
    before = sorted(path.relative_to(folder) for path in folder.rglob("*"))
    result = invoke(str(folder), "--out", str(out), "--epochs", "1", "--processes", "1", "--batch-size", "4")
    assert result.exit_code == 0, result.output[-4000:]
    said = words(result)
    assert f"labels/{BROKEN}.png not_an_image" in said and "notes.txt unexpected_file" in said
    assert f"using {COUNT - 1} of {COUNT + 1} items" in said

    entries = parse_manifest((out / "manifest.jsonl").read_text())
    assert len(entries) == COUNT - 1 and not [e for e in entries if BROKEN in e.image or BROKEN in e.label]
    expected = labeled.build_manifest(folder)
    assert entries == expected.entries
    metrics = MetricsFile.model_validate_json((out / "output" / "metrics.json").read_text())
    assert metrics.dataset_version == expected.version, "the run names the folder's content"
    assert sorted(path.relative_to(folder) for path in folder.rglob("*")) == before, "the folder is only read"


def test_a_folder_with_neither_layout_names_both(tmp_path: Path) -> None:
    result = invoke(str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    said = words(result)
    assert "manifests/*.jsonl" in said and "images/ + labels/" in said and "retrain synth" in said
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_single_valid_pair_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    for name in ("images", "labels"):
        (folder / name).mkdir(parents=True)
    (folder / "images" / "a.jpg").write_bytes(b"not a jpeg")
    (folder / "labels" / "a.png").write_bytes(b"not a png")
    result = invoke(str(folder), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    said = words(result)
    assert "none of the 1 items" in said and "retrain validate" in said and "Traceback" not in said
    assert not (tmp_path / "out").exists(), "nothing is written before the data can be trained on"


def test_too_few_pairs_for_both_splits_says_what_to_do(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path, count=4)
    # Keep two pairs, both on the training side at the default fraction.
    dataset = labeled.build_manifest(folder)
    train = [entry for entry in dataset.entries if entry.split == "train"][:2]
    keep = {entry.image for entry in train} | {entry.label for entry in train}
    for path in [*folder.glob("images/*"), *folder.glob("labels/*")]:
        if path.relative_to(folder).as_posix() not in keep:
            path.unlink()
    result = invoke(str(folder), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    said = words(result)
    assert "none in the validation split" in said and "add pairs, or raise --val-fraction" in said

    result = invoke(str(folder), "--out", str(tmp_path / "out"), "--val-fraction", "1")
    assert result.exit_code == 2 and "leaves a split empty" in words(result)


def test_val_fraction_is_refused_for_a_frozen_manifest(tmp_path: Path) -> None:
    write_scenes(tmp_path, count=2, size=SIZE, seed=0, version="v1")
    result = invoke(str(tmp_path), "--out", str(tmp_path / "out"), "--val-fraction", "0.3")
    assert result.exit_code == 2 and "splits are frozen" in words(result)


def test_a_manifest_outside_the_data_folder_is_passed_by_its_path(tmp_path: Path) -> None:
    manifest = tmp_path / "out" / "manifest.jsonl"
    argv = train_command.trainer_command(
        nproc=1, data_dir=tmp_path / "data", manifest=manifest, out=tmp_path / "out", trainer_args=[]
    )
    assert argv[argv.index("--manifest") + 1] == str(manifest)


def test_the_manifest_written_is_json_lines_the_trainer_reads(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    path = tmp_path / "manifest.jsonl"
    path.write_text(dump_manifest(labeled.build_manifest(folder).entries))
    entries = read_manifest(path)
    assert len(entries) == COUNT - 1 and {e.split for e in entries} == {"train", "val"}
    assert all(json.loads(line)["batch"] == folder.name for line in path.read_text().splitlines())
