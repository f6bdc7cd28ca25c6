"""The input pipeline: decoded fast, cut precisely, the same in any worker, laid out per host."""

from __future__ import annotations

import io
import os
import pickle
import random
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from retrain.synth import default_version, write_scenes
from trainer.checksums import CHECKED
from trainer.data import (
    IGNORE_INDEX,
    Augment,
    ResumableDistributedSampler,
    SegmentationDataset,
    read_manifest,
)
from trainer.decode import (
    ImageDecoder,
    available_decoders,
    decode_label,
    pick_decoder,
    read_file,
    reduction,
)
from trainer.loader import default_prefetch_factor, default_workers, make_loader
from trainer.profiling.monitor import SystemMonitor

# Class colours far apart, so a decoded pixel's nearest colour names its class despite JPEG.
PALETTE = np.array(
    [[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [255, 255, 255]],
    dtype=np.int32,
)


def _blocks(tmp_path: Path, size: tuple[int, int], block: int = 16) -> tuple[Path, list[Any]]:
    """A dataset of one pair: blocks of random classes, the image painted in class colours."""
    rng = np.random.default_rng(0)
    grid = rng.integers(0, len(PALETTE), (size[1] // block, size[0] // block))
    label = np.kron(grid, np.ones((block, block), dtype=np.int64)).astype(np.uint8)
    picture = PALETTE[label].astype(np.uint8)
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    Image.fromarray(picture).save(tmp_path / "images" / "a.jpg", quality=95)
    Image.fromarray(label).save(tmp_path / "labels" / "a.png")
    manifest = tmp_path / "v.jsonl"
    manifest.write_text('{"image": "images/a.jpg", "label": "labels/a.png", "split": "train"}\n')
    return tmp_path, read_manifest(manifest)


def _agreement(image: torch.Tensor, label: torch.Tensor) -> float:
    """Share of labelled pixels whose colour's nearest class is their label."""
    pixels = image.permute(1, 2, 0).numpy().astype(np.int32)
    distances = ((pixels[:, :, None, :] - PALETTE[None, None]) ** 2).sum(-1)
    predicted = distances.argmin(-1)
    labels = label.numpy()
    keep = labels != IGNORE_INDEX
    return float((predicted[keep] == labels[keep]).mean())


def _resize_then_crop(
    image: Image.Image, label: Image.Image, crop: tuple[int, int], rng: random.Random
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The straightforward augmentation the loader must match: scale the whole image, then cut
    the crop out of it (padding with black and ignore), then flip."""
    scale = rng.uniform(0.5, 2.0)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BILINEAR)
    label = label.resize(size, Image.Resampling.NEAREST)
    left = rng.randint(0, max(0, size[0] - crop[0]))
    top = rng.randint(0, max(0, size[1] - crop[1]))
    box = (left, top, left + crop[0], top + crop[1])
    image = image.crop(box)
    padded = Image.new("L", crop, IGNORE_INDEX)
    padded.paste(label.crop((left, top, min(box[2], size[0]), min(box[3], size[1]))), (0, 0))
    pixels, labels = np.asarray(image), np.asarray(padded)
    if rng.random() < 0.5:
        pixels, labels = pixels[:, ::-1], labels[:, ::-1]
    return pixels.transpose(2, 0, 1), labels


@pytest.mark.parametrize("seed", range(8))
def test_cutting_the_window_alone_matches_scaling_the_whole_image_then_cropping(tmp_path: Path, seed: int) -> None:
    root, entries = _blocks(tmp_path, (256, 128), block=8)
    dataset = SegmentationDataset(root, entries, Augment(crop=(96, 48), jitter=0.0))
    image, label = dataset[(0, seed)]
    with (
        Image.open(root / "images" / "a.jpg") as picture,
        Image.open(root / "labels" / "a.png") as mask,
    ):
        expected_image, expected_label = _resize_then_crop(
            picture.convert("RGB"),
            mask.copy(),
            (96, 48),
            random.Random(seed),
        )
    difference = np.abs(image.numpy().astype(int) - expected_image.astype(int)).mean()
    assert difference < 0.5, f"seed {seed}: images differ by {difference:.2f} levels on average"
    # Nearest-neighbour sampling may break a tie (a sample exactly between two source pixels)
    # the other way: a label may differ from the reference only by its neighbour's value.
    got = label.numpy()
    padded = np.pad(expected_label, 1, mode="edge")
    neighbours = [
        padded[1 + dy : 1 + dy + got.shape[0], 1 + dx : 1 + dx + got.shape[1]] for dy in (-1, 0, 1) for dx in (-1, 0, 1)
    ]
    explained = np.any([got == n for n in neighbours], axis=0)
    assert explained.all(), f"seed {seed}: {int((~explained).sum())} labels are off by more"
    assert (got == expected_label).mean() > 0.9


def test_a_smaller_base_size_decodes_the_jpeg_reduced_and_stays_aligned(tmp_path: Path) -> None:
    root, entries = _blocks(tmp_path, (512, 256), block=8)
    requests: list[tuple[int, int] | None] = []

    class Spy(ImageDecoder):
        def decode_rgb(self, data: bytes, at_least: tuple[int, int] | None = None) -> Image.Image:
            requests.append(at_least)
            return super().decode_rgb(data, at_least)

    augment = Augment(crop=(96, 48), scale_min=0.5, scale_max=0.5, jitter=0.0)
    dataset = SegmentationDataset(root, entries, augment, base_size=(256, 128), decoder=Spy())
    image, label = dataset[(0, 3)]
    # Base 256x128 at scale 0.5 is 128x64 of the 512x256 file: a quarter-size decode suffices.
    assert requests == [(128, 64)], f"the decoder was asked for {requests}"
    # Blocks of 8 pixels end up 2 pixels wide: a misalignment of a fraction of one would show.
    agreement = _agreement(image, label)
    assert agreement > 0.99, f"a reduced decode is off its label: {agreement:.3f} agree"


def test_a_crop_beyond_the_scaled_image_is_black_and_ignored(tmp_path: Path) -> None:
    root, entries = _blocks(tmp_path, (64, 32))
    augment = Augment(crop=(96, 48), scale_min=1.0, scale_max=1.0, flip=False, jitter=0.0)
    image, label = SegmentationDataset(root, entries, augment)[(0, 1)]
    assert (label[:, 64:] == IGNORE_INDEX).all() and (label[32:, :] == IGNORE_INDEX).all()
    assert (image[:, :, 64:] == 0).all(), "padding pixels must be black"
    assert (label[:32, :64] != IGNORE_INDEX).all(), "the image's own pixels keep their labels"


def test_jitter_changes_colours_but_never_labels(tmp_path: Path) -> None:
    root, entries = _blocks(tmp_path, (128, 64))
    plain = SegmentationDataset(root, entries, Augment(crop=(64, 32), jitter=0.0))[(0, 5)]
    jittered = SegmentationDataset(root, entries, Augment(crop=(64, 32), jitter=0.4))[(0, 5)]
    assert torch.equal(plain[1], jittered[1]), "jitter must leave the label alone"
    assert not torch.equal(plain[0], jittered[0]), "jitter 0.4 should change the colours"


def test_a_palette_mask_is_read_as_class_ids_not_as_colours() -> None:
    ids = np.array([[0, 1, 2, 255]], dtype=np.uint8)
    mask = Image.fromarray(ids).convert("P")
    # Palette indices are the ids; the colours (road red, sidewalk green...) are only a view.
    mask.putpalette([128, 64, 128, 244, 35, 232, 70, 70, 70] + [0] * 759)
    buffer = io.BytesIO()
    mask.save(buffer, "PNG")
    label = decode_label(buffer.getvalue(), "labels/a.png")
    assert label.mode == "L"
    assert np.asarray(label).tolist() == ids.tolist()


def test_files_are_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 1000)
    assert read_file(path) == bytes(range(256)) * 1000


def test_workers_hand_over_the_very_batches_the_training_process_would_make(
    tmp_path: Path,
) -> None:
    write_scenes(tmp_path, count=12, size=(64, 32), seed=3)
    entries = read_manifest(tmp_path / "manifests" / f"{default_version(3, 12, (64, 32))}.jsonl")
    dataset = SegmentationDataset(tmp_path, entries, Augment(crop=(48, 24)))

    def batches(workers: int) -> list[torch.Tensor]:
        sampler = ResumableDistributedSampler(dataset, num_replicas=1, rank=0, seed=7)
        sampler.set_epoch(2)
        loader = make_loader(
            dataset,
            batch_size=4,
            sampler=sampler,
            workers=workers,
            pin_memory=False,
            drop_last=True,
        )
        return [images for images, _ in loader]

    in_process, in_workers = batches(0), batches(2)
    assert len(in_process) == len(in_workers) == 3
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers, strict=True)), (
        "augmentation must not depend on which process decodes a sample"
    )


def _scenes(root: Path, *, verify: bool = False) -> SegmentationDataset:
    write_scenes(root, count=8, size=(64, 32), seed=3)
    entries = read_manifest(root / "manifests" / f"{default_version(3, 8, (64, 32))}.jsonl")
    return SegmentationDataset(
        root, entries, Augment(crop=(48, 24)), decoder=ImageDecoder(pick_decoder("auto")), verify=verify
    )


def test_workers_start_from_a_fork_server_not_by_forking_the_training_process(tmp_path: Path) -> None:
    dataset = _scenes(tmp_path, verify=True)
    loader = make_loader(dataset, batch_size=2, sampler=[(i, i) for i in range(8)], workers=2, pin_memory=False)
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    assert loader.persistent_workers
    batches = iter(loader)
    next(batches)
    workers = batches._workers  # type: ignore[attr-defined]
    parents = {psutil.Process(worker.pid).ppid() for worker in workers}
    assert len(workers) == 2 and os.getpid() not in parents, "a worker was forked from the training process"
    # In the training process: no worker, so no fork server either.
    in_process = make_loader(dataset, batch_size=2, sampler=[(0, 0)], workers=0, pin_memory=False)
    assert in_process.multiprocessing_context is None


def test_what_the_workers_get_travels_pickled_and_comes_back_whole(tmp_path: Path) -> None:
    # The training loaders' dataset (with its shared checksum table), and the screening loader's.
    from trainer.screening.screener import _as_list, _Indexed  # noqa: PLC0415

    dataset = _scenes(tmp_path, verify=True)
    subset = _Indexed(dataset, [5, 2, 7])
    loader = make_loader(subset, batch_size=3, sampler=list(range(3)), workers=2, pin_memory=False, collate_fn=_as_list)
    ((first, image, label), *rest) = next(iter(loader))
    assert [first, *(item[0] for item in rest)] == [5, 2, 7]
    assert torch.equal(image, dataset[5][0]) and torch.equal(label, dataset[5][1])
    assert dataset.checksums is not None
    assert int(dataset.checksums.flags[5]) == CHECKED, "a worker's verdict did not reach the training process"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12 is the first to warn of fork() with threads")
def test_loader_workers_start_without_forking_a_process_whose_threads_run(tmp_path: Path) -> None:
    dataset = _scenes(tmp_path)
    # The profiler's sampler runs, as in every training run when the loaders start.
    sampler = SystemMonitor(tmp_path / "profile", node="algo-1", interval_ms=100, pids=[os.getpid()], gpus=False)
    sampler.start()
    try:
        with warnings.catch_warnings(record=True) as forked:
            warnings.simplefilter("always")
            # What the warning looks like: a loader that forks the training process.
            next(
                iter(DataLoader(dataset, batch_size=2, sampler=[(0, 0)], num_workers=1, multiprocessing_context="fork"))
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make_loader(dataset, batch_size=2, sampler=[(i, i) for i in range(8)], workers=2, pin_memory=False)
            assert len(list(loader)) == 4
    finally:
        sampler.stop()
    assert any("fork()" in str(warning.message) for warning in forked), [str(w.message) for w in forked]
    assert not [str(w.message) for w in caught if "fork()" in str(w.message)]


@pytest.mark.parametrize(
    ("cores", "processes", "accelerator", "workers"),
    [
        (96, 8, True, 11),  # ml.p4d.24xlarge: 12 vCPUs per GPU, one left for the trainer
        (2, 1, True, 1),  # this machine, one process: never decode in the training process
        (8, 8, True, 1),
        (16, 2, False, 0),  # CPU training: the model needs the cores
    ],
)
def test_workers_are_the_process_share_of_the_cores_less_one(
    cores: int, processes: int, accelerator: bool, workers: int
) -> None:
    assert default_workers(processes, accelerator, cores=cores) == workers


def test_about_eight_batches_are_queued_per_process_and_two_per_worker() -> None:
    assert [default_prefetch_factor(w) for w in (1, 2, 3, 4, 11)] == [8, 4, 3, 2, 2]


def test_pillow_is_always_there_and_auto_picks_the_fastest() -> None:
    available = available_decoders()
    assert available[-1] == "pillow"
    assert pick_decoder("auto") == available[0]
    with pytest.raises(ValueError, match="unknown decoder"):
        pick_decoder("libjpeg9000")


def test_a_decoder_that_is_not_installed_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 now raises ImportError
    with pytest.raises(ValueError, match="not installed"):
        pick_decoder("opencv")


def _jpeg(size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _fake_simplejpeg(fail: bool) -> types.ModuleType:
    """simplejpeg's decode_jpeg as documented, done with Pillow (the real one is not installed)."""
    module = types.ModuleType("simplejpeg")

    def decode_jpeg(
        data: bytes, colorspace: str = "RGB", min_width: int = 0, min_height: int = 0
    ) -> np.ndarray[Any, Any]:
        if fail:
            raise ValueError("unsupported colour space")
        image = Image.open(io.BytesIO(data))
        if min_width or min_height:
            image.draft("RGB", (min_width, min_height))
        return np.asarray(image.convert(colorspace))

    module.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    return module


def test_a_fast_decoder_reduces_when_asked_and_pillow_takes_what_it_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _jpeg((256, 128))
    monkeypatch.setitem(sys.modules, "simplejpeg", _fake_simplejpeg(fail=False))
    assert pick_decoder("auto") == "simplejpeg"
    reduced = ImageDecoder("simplejpeg").decode_rgb(data, at_least=(64, 32))
    assert reduced.size == (64, 32) and reduction((256, 128), reduced.size) == 4
    whole = ImageDecoder("simplejpeg").decode_rgb(data)
    assert np.array_equal(np.asarray(whole), np.asarray(ImageDecoder("pillow").decode_rgb(data)))

    monkeypatch.setitem(sys.modules, "simplejpeg", _fake_simplejpeg(fail=True))
    with pytest.warns(RuntimeWarning, match="Pillow decodes it"):
        fallback = ImageDecoder("simplejpeg").decode_rgb(data)
    assert fallback.size == (256, 128) and fallback.mode == "RGB"


def test_a_decoder_travels_to_workers_without_its_library_handle() -> None:
    decoder = ImageDecoder("pillow")
    decoder._library = object()  # stands for an unpicklable handle
    assert pickle.loads(pickle.dumps(decoder)).name == "pillow"


def test_the_plan_draws_the_same_augmentation_from_the_same_seed() -> None:
    augment = Augment(crop=(96, 48))
    first = augment.plan((256, 128), random.Random(9))
    again = augment.plan((256, 128), random.Random(9))
    assert first == again
