"""A command checks its arguments before it acts: a wrong one exits 2 with a clear line, and
nothing is touched (no folder deleted or made, no stack started)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from retrain.cli import app
from retrain.commands import synth as synth_command
from retrain.synth import write_scenes

runner = CliRunner()
WIDE = {"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"}  # the error box wraps no path


def test_train_on_a_file_that_is_no_manifest_leaves_out_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.pt").write_bytes(b"a previous run's checkpoint")
    for name, content in (("notes.txt", b"not json\n"), ("photo.png", b"\x89PNG\r\n\x1a\n\xff\xfe")):
        wrong = tmp_path / name
        wrong.write_bytes(content)
        result = runner.invoke(app, ["train", str(wrong), "--out", str(out)], env=WIDE)
        assert result.exit_code == 2, result.output
        assert "is not a dataset manifest" in result.output
        assert (out / "checkpoints" / "last.pt").read_bytes() == b"a previous run's checkpoint"
        assert sorted(path.name for path in out.iterdir()) == ["checkpoints"]


def test_train_on_a_manifest_whose_image_is_missing_leaves_out_alone(tmp_path: Path) -> None:
    write_scenes(tmp_path / "data", count=2, size=(64, 32), seed=0, version="v1")
    for image in (tmp_path / "data" / "images").iterdir():
        image.unlink()
    out = tmp_path / "out"
    result = runner.invoke(app, ["train", str(tmp_path / "data"), "--out", str(out)], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "the manifest's first image" in result.output
    assert not out.exists()


@pytest.mark.parametrize("size", ["0x0", "31x16", "32x15", "big"])
def test_synth_refuses_a_size_it_cannot_draw_before_making_a_folder(tmp_path: Path, size: str) -> None:
    out = tmp_path / "scenes"
    result = runner.invoke(app, ["synth", str(out), "--size", size], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "--size" in result.output
    assert not out.exists()


def test_synth_s_minimum_is_what_it_draws() -> None:
    width, height = synth_command.MIN_SIZE
    assert synth_command.parse_size(f"{width}x{height}") == (width, height)
    with pytest.raises(ValueError, match="at least"):
        write_scenes(Path("/nonexistent"), count=1, size=(width - 1, height), seed=0)
    with pytest.raises(ValueError, match="at least"):
        write_scenes(Path("/nonexistent"), count=1, size=(width, height - 1), seed=0)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--size", "0x0"], "below the minimum of 32x32"),
        (["--size", "32x16"], "below the minimum of 32x32"),  # synth draws it; the intake refuses it
        (["--out", "FILE"], "is a file, not a folder"),
    ],
)
def test_demo_checks_its_arguments_before_starting_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    import retrain.local.demo  # noqa: PLC0415

    def no_stack(*_: object, **__: object) -> None:
        raise AssertionError("the demo started")

    monkeypatch.setattr(retrain.local.demo, "Demo", no_stack)
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / "FILE") if arg == "FILE" else arg for arg in args]
    result = runner.invoke(app, ["local", "demo", *args], env=WIDE)
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_package_trainer_into_a_folder_it_cannot_make_says_so_and_builds_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")

    result = runner.invoke(app, ["package-trainer", str(blocker / "trainer")], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"cannot use {blocker / 'trainer'} for the archive: Not a directory" in result.stderr
    assert blocker.read_text() == "not a folder\n"
