"""A job warm-starts from the accepted model however SageMaker handed it over, and says so."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch

from functions.common.contracts import WarmStartInfo
from functions.common.taxonomy import CITYSCAPES_CLASSES
from trainer import checkpoint, warm_start
from trainer.model import BiSeNetV2

CLASSES = list(CITYSCAPES_CLASSES)


def _model_file(path: Path) -> dict[str, torch.Tensor]:
    model = BiSeNetV2(len(CLASSES), width=0.25)
    checkpoint.save_atomically(checkpoint.model_document(model.state_dict(), width=0.25, classes=CLASSES), path)
    return model.state_dict()


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_a_channel_holding_sagemakers_model_tar_gz_is_a_warm_start(tmp_path: Path) -> None:
    weights = _model_file(tmp_path / "job" / "model.pt")
    channel = tmp_path / "channel"
    channel.mkdir()
    _archive(
        channel / "model.tar.gz",
        {"model.pt": (tmp_path / "job" / "model.pt").read_bytes(), "metrics.json": b"{}"},
    )

    start = warm_start.from_channel(str(channel))

    assert (start.origin, start.kind, start.path) == ("model channel", "tar.gz", channel / "model.tar.gz")
    assert "model.pt inside" in start.describe() and start.sha256 in start.describe()
    WarmStartInfo.model_validate(start.lineage())
    loaded = BiSeNetV2(len(CLASSES), width=0.25)
    checkpoint.load_weights(loaded, channel / "model.tar.gz", 0.25, CLASSES)
    assert torch.equal(loaded.state_dict()["head.2.weight"], weights["head.2.weight"])
    assert not (channel / "model.pt").exists(), "the archive is read in memory, never unpacked"


def test_model_pt_is_preferred_when_the_channel_holds_both(tmp_path: Path) -> None:
    _model_file(tmp_path / "model.pt")
    _archive(tmp_path / "model.tar.gz", {"model.pt": (tmp_path / "model.pt").read_bytes()})

    assert warm_start.from_channel(str(tmp_path)).kind == "pt"


@pytest.mark.parametrize(
    ("make", "origin", "reason"),
    [
        (lambda root: None, "no model channel", "SM_CHANNEL_MODEL is not set"),
        (lambda root: str(root / "absent"), "model channel missing", "which is not a folder"),
        (str, "model channel empty", "is empty"),
        (
            lambda root: (root / "weights.bin").write_bytes(b"x") and str(root),
            "no model in channel",
            "holds neither model.pt nor model.tar.gz (it has: weights.bin)",
        ),
    ],
)
def test_training_from_scratch_always_says_why(tmp_path: Path, make: object, origin: str, reason: str) -> None:
    channel = make(tmp_path)  # type: ignore[operator]

    start = warm_start.from_channel(channel)

    assert start.path is None and start.origin == origin
    assert reason in start.reason and start.describe().startswith("training from scratch")
    WarmStartInfo.model_validate(start.lineage())


def test_from_scratch_overrides_init_from_and_the_channel(tmp_path: Path) -> None:
    _model_file(tmp_path / "model.pt")

    start = warm_start.resolve(init_from=str(tmp_path / "model.pt"), from_scratch=True, channel=str(tmp_path))

    assert start.path is None and "--from-scratch" in start.reason


def test_init_from_accepts_a_model_tar_gz_named_anything(tmp_path: Path) -> None:
    _model_file(tmp_path / "model.pt")
    packed = _archive(tmp_path / "output-of-job-42", {"./model.pt": (tmp_path / "model.pt").read_bytes()})

    start = warm_start.resolve(init_from=str(packed), from_scratch=False, channel=None)

    assert (start.origin, start.kind) == ("--init-from", "tar.gz"), "a file is told by its content"
    assert checkpoint.load_model_document(packed)["format"] == checkpoint.MODEL_FORMAT


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({"../model.pt": b"x"}, "member outside the archive"),
        ({"/etc/model.pt": b"x"}, "member outside the archive"),
        ({"metrics.json": b"{}"}, "should hold one model.pt at its root; it holds metrics.json"),
        ({"model/model.pt": b"x"}, "should hold one model.pt at its root"),
    ],
)
def test_an_archive_that_is_not_a_packed_model_folder_is_refused(
    tmp_path: Path, members: dict[str, bytes], message: str
) -> None:
    archive = _archive(tmp_path / "model.tar.gz", members)

    with pytest.raises(warm_start.ModelArchiveError, match=message):
        checkpoint.load_model_document(archive)


def test_a_truncated_archive_is_refused_with_its_path(tmp_path: Path) -> None:
    _model_file(tmp_path / "model.pt")
    whole = _archive(tmp_path / "whole.tar.gz", {"model.pt": (tmp_path / "model.pt").read_bytes()}).read_bytes()
    cut = tmp_path / "model.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(warm_start.ModelArchiveError, match=r"model\.tar\.gz is not a readable model\.tar\.gz"):
        checkpoint.load_model_document(cut)
