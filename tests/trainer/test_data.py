"""The trainer reads a frozen manifest and feeds augmented uint8 batches, resumably."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler

from functions.common.contracts import parse_manifest
from retrain.synth import default_version, write_scenes
from trainer.data import (
    IGNORE_INDEX,
    Augment,
    EpochLayout,
    ResumableDistributedSampler,
    SegmentationDataset,
    ShardSampler,
    class_weights,
    parse_size,
    read_manifest,
    to_device,
)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scenes")
    write_scenes(root, count=20, size=(96, 48), seed=4)
    return root


def _manifest(root: Path) -> Path:
    return root / "manifests" / f"{default_version(4, 20, (96, 48))}.jsonl"


def test_the_trainer_reads_the_same_pairs_the_functions_wrote(scenes: Path) -> None:
    entries = read_manifest(_manifest(scenes))
    modelled = parse_manifest(_manifest(scenes).read_text())
    assert [(e.image, e.label, e.split) for e in entries] == [(m.image, m.label, m.split) for m in modelled]
    assert all(e.class_pixels for e in entries), "class_pixels must reach the trainer"


def test_a_broken_manifest_line_is_reported_with_its_number(tmp_path: Path) -> None:
    manifest = tmp_path / "v.jsonl"
    good = {"image": "images/a.jpg", "label": "labels/a.png", "split": "train"}
    manifest.write_text(json.dumps(good) + "\n\n" + json.dumps({"image": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"v\.jsonl:3"):
        read_manifest(manifest)


def test_a_split_other_than_train_or_val_is_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "v.jsonl"
    entry = {"image": "images/a.jpg", "label": "labels/a.png", "split": "test"}
    manifest.write_text(json.dumps(entry) + "\n")
    with pytest.raises(ValueError, match="split must be train or val"):
        read_manifest(manifest)


def test_samples_leave_the_workers_as_uint8_and_are_normalised_on_the_device(
    scenes: Path,
) -> None:
    entries = read_manifest(_manifest(scenes))
    dataset = SegmentationDataset(scenes, entries, Augment(crop=(64, 32)))
    image, label = dataset[(0, 123)]
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 32, 64)
    assert label.dtype == torch.uint8 and tuple(label.shape) == (32, 64)

    images, labels = to_device(image[None], label[None], torch.device("cpu"), channels_last=False)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert -3.0 < float(images.mean()) < 3.0, "images must be normalised, not 0-255"


def test_the_same_augmentation_seed_gives_the_same_sample(scenes: Path) -> None:
    dataset = SegmentationDataset(scenes, read_manifest(_manifest(scenes)), Augment(crop=(64, 32)))
    first, again, other = dataset[(2, 7)], dataset[(2, 7)], dataset[(2, 8)]
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0]), "another seed should augment differently"


def test_a_crop_larger_than_the_scaled_image_is_padded_with_ignore() -> None:
    image = Image.new("RGB", (40, 20), (10, 20, 30))
    label = Image.new("L", (40, 20), 3)
    augment = Augment(crop=(64, 32), scale_min=1.0, scale_max=1.0, flip=False)
    out_image, out_label = augment(image, label, random.Random(0))
    values = np.asarray(out_label)
    assert out_image.size == (64, 32) and out_label.size == (64, 32)
    assert set(np.unique(values).tolist()) == {3, IGNORE_INDEX}, "padding must be ignore (255)"
    assert (values[:20, :40] == 3).all(), "the image's own pixels keep their class"


def test_resuming_the_sampler_yields_exactly_what_the_interrupted_epoch_had_left(
    scenes: Path,
) -> None:
    dataset = SegmentationDataset(scenes, read_manifest(_manifest(scenes)))
    sampler = ResumableDistributedSampler(dataset, num_replicas=2, rank=1, seed=5)
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3)
    # 4 samples of rank 1's shard done: 8 of the epoch's global order, over both ranks.
    sampler.resume_at(8)
    assert list(sampler) == full[4:], "resume_at(8) must resume at rank 1's fifth sample of the epoch"
    assert len(list(sampler)) == len(full), "resuming applies to one pass only"

    reference: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5)
    reference.set_epoch(3)
    assert [index for index, _ in full] == list(reference), "order must be DistributedSampler's"
    sampler.set_epoch(4)
    assert [i for i, _ in sampler] != [i for i, _ in full], "set_epoch must reshuffle"


@pytest.mark.parametrize(("written_by", "resumed_on", "position"), [(2, 1, 24), (1, 2, 12), (4, 3, 16), (2, 4, 10)])
def test_an_epoch_resumed_on_another_world_size_trains_each_remaining_sample_once(
    written_by: int, resumed_on: int, position: int
) -> None:
    samples = list(range(48))
    before = [ResumableDistributedSampler(samples, written_by, rank, seed=7) for rank in range(written_by)]
    done: list[int] = []
    for sampler in before:
        sampler.set_epoch(2)
        # Each writer rank's first position / written_by samples: together, the order's prefix.
        done += [index for index, _ in list(sampler)[: position // written_by]]
    after = [ResumableDistributedSampler(samples, resumed_on, rank, seed=7) for rank in range(resumed_on)]
    rest: list[int] = []
    for sampler in after:
        sampler.set_epoch(2)
        sampler.resume_at(position)
        expected = len(sampler)
        keys = list(sampler)
        assert len(keys) == expected, "len() must say what the pass yields"
        rest += [index for index, _ in keys]

    assert set(done) | set(rest) == set(samples), "the two jobs must cover the epoch"
    repeats = len(done) + len(rest) - len(samples)
    assert 0 <= repeats < resumed_on, "only DistributedSampler's padding (under a world size) may repeat"
    assert len(set(done + rest)) == len(samples) and len(done) == len(set(done))
    order = after[0].order()
    assert sorted(done) == sorted(order[:position]), "a position is a prefix of the epoch's global order"


def test_the_epoch_layout_counts_a_resumed_epoch_in_this_jobs_steps() -> None:
    layout = EpochLayout(samples=48, world_size=1, rank_batch=8)
    assert (layout.steps, layout.step_samples) == (6, 8)
    # Written by 2 ranks x 4 after 3 steps (24 samples): this job has 3 steps of 8 left.
    assert (layout.first_step(24), layout.steps_left(24)) == (3, 3)
    # A position no step of ours reached: the partial step is trained, as the rest of the epoch.
    assert (layout.first_step(20), layout.steps_left(20)) == (3, 3)
    assert layout.steps_left(48) == 0


@pytest.mark.parametrize(("length", "world"), [(10, 3), (7, 2), (2, 4)])
def test_evaluation_shards_cover_every_sample_exactly_once(length: int, world: int) -> None:
    shards = [list(ShardSampler(length, world, rank)) for rank in range(world)]
    merged = sorted(index for shard in shards for index in shard)
    assert merged == list(range(length)), f"shards {shards} must partition range({length})"


def test_rare_classes_weigh_more_and_absent_ones_stay_neutral(scenes: Path) -> None:
    entries = read_manifest(_manifest(scenes))
    weights = class_weights(entries, num_classes=19)
    road, pole, rider = weights[0], weights[5], weights[12]
    assert pole > road, f"thin poles ({pole:.2f}) must weigh more than the road ({road:.2f})"
    assert rider == 1.0, "a class absent from the training split keeps weight 1"


@pytest.mark.parametrize(("text", "size"), [("128x64", (128, 64)), ("96", (96, 96))])
def test_sizes_are_width_by_height(text: str, size: tuple[int, int]) -> None:
    assert parse_size(text) == size


def test_a_malformed_size_is_refused() -> None:
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_size("wide")
