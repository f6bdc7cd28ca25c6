"""A command checks its arguments before it acts: a wrong one exits 2 with a clear line, and
nothing is touched (no folder deleted or made, no stack started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
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
        (["--size", "9000x64"], "above the maximum of 8192x8192"),
        (["--out", "FILE"], "is a file, not a folder"),
        (["--out", "FILE/demo"], "is a file, not a folder"),
        (["--timeout", "inf"], "is not a finite number"),
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
    args = [str(tmp_path / arg) if arg.startswith("FILE") else arg for arg in args]
    result = runner.invoke(app, ["local", "demo", *args], env=WIDE)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())


def test_package_trainer_into_a_folder_it_cannot_make_says_so_and_builds_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")

    result = runner.invoke(app, ["package-trainer", str(blocker / "trainer")], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"cannot use {blocker / 'trainer'} for the archive: Not a directory" in result.stderr
    assert blocker.read_text() == "not a folder\n"


# The trainer's own flags, as `retrain train` passes them on: each refused here, before OUT's
# checkpoints are deleted, in the trainer's words.
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--crop", "abc"], "--crop: expected WIDTHxHEIGHT or one number, got 'abc'"),
        (["--crop", "0x0"], "--crop: a size must be positive"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--momentum", "abc"], "argument --momentum: invalid float value: 'abc'"),
        (["--scale-max", "0.5"], "--scale-min 0.75 and --scale-max 0.5: need 0 < min <= max"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--width", "inf"], "is not a finite number"),
        (["--out", "FILE"], "is a file, not a folder"),
        (["--out", "FILE/run"], "is a file, not a folder"),
    ],
)
def test_train_refuses_a_flag_before_it_deletes_the_last_checkpoints(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    write_scenes(tmp_path / "data", count=4, size=(64, 32), seed=0, version="v1")
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.pt").write_bytes(b"a previous run's checkpoint")
    (tmp_path / "FILE").write_text("not a folder\n")
    flags = [flag.replace("FILE", str(tmp_path / "FILE")) for flag in flags]

    result = runner.invoke(app, ["train", str(tmp_path / "data"), "--out", str(out), *flags], env=WIDE)

    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()), result.output
    assert (out / "checkpoints" / "last.pt").read_bytes() == b"a previous run's checkpoint"
    assert sorted(path.name for path in out.iterdir()) == ["checkpoints"]
    assert (tmp_path / "FILE").read_text() == "not a folder\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["OUT=FILE"], "is a file, not a folder"),
        (["OUT=FILE/scenes"], "is a file, not a folder"),
        (["--size", "8193x64"], "above the maximum of 8192x8192 the intake accepts"),
        (["--size", "8000x8000"], "64000000 pixels, above the 40000000 the intake accepts"),
        (["--dataset-version", "a/b"], "'a/b' is not a dataset version"),
        (["--dataset-version", "../../elsewhere"], "is not a dataset version"),
        (["--version", "with space"], "is not a dataset version"),
        (["--val-fraction", "nan"], "--val-fraction"),
    ],
)
def test_synth_refuses_a_value_before_it_draws_or_makes_a_folder(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "FILE").write_text("not a folder\n")
    out = str(tmp_path / "scenes")
    if args[0].startswith("OUT="):
        out, args = str(tmp_path / args[0].removeprefix("OUT=")), []

    result = runner.invoke(app, ["synth", out, "--count", "2", *args], env=WIDE)

    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()), result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["FILE"], "something was drawn"
    assert (tmp_path / "FILE").read_text() == "not a folder\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--port", "70000"], "--port"),
        (["--tick-seconds", "0"], "--tick-seconds"),
        (["--tick-seconds", "inf"], "is not a finite number"),
        (["--param", "NoSuchParameter=1"], "the template has no parameter NoSuchParameter"),
        (["--param", "TrainingEpochs=many"], "parameter TrainingEpochs: 'many' is not a number"),
        (["--lambda-concurrency", "0"], "--lambda-concurrency"),
    ],
)
def test_local_up_checks_its_arguments_before_starting_the_stack(
    monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    from retrain.local.cloudformation import stack  # noqa: PLC0415

    def no_stack(*_: object, **__: object) -> None:
        raise AssertionError("the stack started")

    monkeypatch.setattr(stack.OfflineStack, "start", no_stack)
    result = runner.invoke(app, ["local", "up", *args], env=WIDE)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split()), result.output


def test_local_up_s_own_parameters_pass_the_check_it_makes_before_starting() -> None:
    from retrain.local.cloudformation.stack import OFFLINE_TRAINING, StackOptions, check_parameters  # noqa: PLC0415

    check_parameters(StackOptions(mode="server", parameters={**OFFLINE_TRAINING, "TrainingEpochs": "10"}))


ADVICE = ["advise", "--efficiency", "0.9", "--target-epoch-minutes", "6"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--throughput", "0", "--dataset-size", "1000"], "0.0 is not a finite number above 0"),
        (["--throughput", "-5", "--dataset-size", "1000"], "-5.0 is not a finite number above 0"),
        (["--throughput", "nan", "--dataset-size", "1000"], "nan is not a finite number above 0"),
        (["--throughput", "10", "--dataset-size", "1000", "--target-epoch-minutes", "inf"], "not a finite number"),
        (["--throughput", "10", "--dataset-size", "1000", "--stall-fraction", "nan"], "--stall-fraction"),
        (["--from-metrics", "NOT_JSON"], "is not a run's metrics.json: Invalid JSON"),
        (["--from-metrics", "NOT_METRICS"], "is not a run's metrics.json: dataset_version: Field required"),
    ],
)
def test_advise_says_which_value_is_wrong_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "NOT_JSON").write_text("x\n")
    (tmp_path / "NOT_METRICS").write_text('{"miou": 0.5}\n')
    args = [str(tmp_path / arg) if arg.startswith("NOT_") else arg for arg in args]
    result = runner.invoke(app, [*ADVICE, *args], env=WIDE)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), "a traceback"
    assert said in " ".join(result.output.split()), result.output


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "show", "no such/run"],
        ["runs", "cancel", "a run"],
        ["runs", "rerun", "x;y"],
        ["link", "../elsewhere"],
    ],
)
def test_a_run_that_cannot_be_named_so_is_refused_before_any_aws_call(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from retrain import target  # noqa: PLC0415

    def no_connection(*_: object, **__: object) -> None:
        raise AssertionError("the command went to AWS")

    monkeypatch.setattr(target, "connect", no_connection)
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 2, result.output
    assert "is not a run's name" in result.output


def test_purge_refuses_a_state_machine_arn_before_it_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    from retrain.commands import data  # noqa: PLC0415

    def no_connection(*_: object, **__: object) -> None:
        raise AssertionError("the purge connected")

    monkeypatch.setattr(data, "_connect", no_connection)
    result = runner.invoke(app, ["data", "purge", "b1/x", "--state-machine-arn", "retrain"], env=WIDE)
    assert result.exit_code == 2, result.output
    assert "'retrain' is not a state machine's ARN" in " ".join(result.output.split())


def _commands(command: Any) -> list[Any]:
    return [command, *(c for sub in getattr(command, "commands", {}).values() for c in _commands(sub))]


FLOAT_OPTIONS = [
    (command, param)
    for command in _commands(typer.main.get_command(app))
    for param in command.params
    if param.type_descriptor.annotation is float  # `float | None` too
]


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400"])
def test_every_float_option_of_every_command_refuses_what_is_no_number(text: str) -> None:
    # nan passes any min and max (every comparison with it is false), inf passes a min alone.
    assert len(FLOAT_OPTIONS) >= 12, [param.name for _, param in FLOAT_OPTIONS]
    for command, param in FLOAT_OPTIONS:
        with pytest.raises(typer.BadParameter):
            param.process_value(typer.Context(command), text)
            pytest.fail(f"{command.name} --{param.name} took {text}")
