"""SageMaker hands the trainer its hyperparameters as strings and its folders as variables."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from functions.common.taxonomy import CITYSCAPES_CLASSES
from trainer import checkpoint
from trainer.build import warm_start_of
from trainer.flags import CITYSCAPES_CLASSES as TRAINER_CLASSES
from trainer.flags import get_args_parser, str2bool
from trainer.model import BiSeNetV2


@pytest.mark.parametrize("text", ["true", "True", "TRUE", "1", "yes"])
def test_truthy_strings_parse_as_true(text: str) -> None:
    assert str2bool(text) is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no"])
def test_falsy_strings_parse_as_false(text: str) -> None:
    assert str2bool(text) is False


def test_a_boolean_that_is_neither_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="true or false"):
        str2bool("maybe")


def test_hyperparameters_parse_as_sagemaker_passes_them() -> None:
    args = get_args_parser().parse_args(
        ["--amp", "False", "--from-scratch", "true", "--epochs", "3", "--lr", "0.01", "--sync-bn"]
    )
    assert args.amp is False and args.from_scratch is True and args.sync_bn is True
    assert args.epochs == 3 and args.lr == 0.01


def test_folders_default_to_the_container_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train")
    monkeypatch.setenv("SM_MODEL_DIR", "/opt/ml/model")
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data")
    args = get_args_parser().parse_args([])
    assert args.data_dir == "/opt/ml/input/data/train"
    assert args.model_dir == "/opt/ml/model"
    assert args.output_data_dir == "/opt/ml/output/data"
    assert args.checkpoint_dir == "/opt/ml/checkpoints"


def test_the_trainers_default_classes_are_the_projects_taxonomy() -> None:
    assert tuple(TRAINER_CLASSES.split(",")) == CITYSCAPES_CLASSES, (
        "trainer/flags.py repeats the Cityscapes classes; they drifted from taxonomy.py"
    )


def test_training_starts_from_the_accepted_model_in_the_model_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = get_args_parser()
    monkeypatch.setenv("SM_CHANNEL_MODEL", str(tmp_path))
    start = warm_start_of(parser.parse_args([]))
    assert start.path is None and start.origin == "model channel empty", "no model in the channel: from scratch"

    model = BiSeNetV2(19, width=0.25)
    document = checkpoint.model_document(model.state_dict(), width=0.25, classes=list(CITYSCAPES_CLASSES))
    checkpoint.save_atomically(document, tmp_path / "model.pt")
    assert warm_start_of(parser.parse_args([])).path == tmp_path / "model.pt"
    assert warm_start_of(parser.parse_args(["--from-scratch", "true"])).path is None
    elsewhere = tmp_path / "elsewhere.pt"
    elsewhere.write_bytes((tmp_path / "model.pt").read_bytes())
    assert warm_start_of(parser.parse_args(["--init-from", str(elsewhere)])).path == elsewhere
    with pytest.raises(SystemExit, match="no such file"):
        warm_start_of(parser.parse_args(["--init-from", str(tmp_path / "missing.pt")]))
    loaded = checkpoint.load_model_document(tmp_path / "model.pt")
    assert not any(key.startswith("aux_heads.") for key in loaded["state_dict"]), (
        "the model file must not carry the training-only booster heads"
    )
    assert torch.equal(loaded["state_dict"]["head.2.weight"], model.state_dict()["head.2.weight"])


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--crop", "abc"], "--crop: expected WIDTHxHEIGHT"),
        (["--base-size", "0x10"], "--base-size: a size must be positive"),
        (["--lr", "-0.1"], "--lr must be at least 0"),
        (["--weight-decay", "nan"], "--weight-decay must be at least 0"),
        (["--width", "0"], "--width must be above 0"),
        (["--scale-min", "2", "--scale-max", "1"], "need 0 < min <= max"),
    ],
)
def test_flags_that_cannot_make_a_run_are_refused_before_any_work(flags: list[str], said: str) -> None:
    from trainer.build import check_args  # noqa: PLC0415

    folders = ["--data-dir", "d", "--model-dir", "m", "--output-data-dir", "o"]
    check_args(get_args_parser().parse_args(folders))  # the defaults make a run
    with pytest.raises(SystemExit, match=said):
        check_args(get_args_parser().parse_args([*folders, *flags]))
