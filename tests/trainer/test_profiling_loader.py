"""DataStall on real loaders: a starved one is named, the default one is not.

As in the input-pipeline benchmark, the accelerator is emulated by a fixed wait per batch, which
leaves the CPUs to the loader as a GPU would (on 2 shared cores, real compute would compete with
the loader and measure the machine instead). The emulated step is calibrated to twice what one
process takes to decode and augment a batch here, so one worker (the default for one process on
two cores) keeps up with it, and decoding in the training process (0 workers) must stall about a
third of each step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Sampler

from retrain.synth import write_scenes
from trainer.data import Augment, SampleKey, SegmentationDataset, augmentation_seed, read_manifest
from trainer.decode import ImageDecoder, pick_decoder
from trainer.loader import make_loader
from trainer.profiling.rules import ProfileData, evaluate
from trainer.profiling.steps import StepTimeline

pytestmark = pytest.mark.slow(seconds=5)  # the longest test here, on 2 cores

SIZE, BATCH, STEPS = (512, 256), 4, 60


class Keys(Sampler[SampleKey]):
    def __init__(self, length: int, samples: int) -> None:
        self.length, self.samples = length, samples

    def __iter__(self) -> Iterator[SampleKey]:
        order = random.Random(0)
        for _ in range(self.samples):
            index = order.randrange(self.length)
            yield (index, augmentation_seed(0, 0, index))

    def __len__(self) -> int:
        return self.samples


def _run(dataset: SegmentationDataset, workers: int, step: float, profile: Path) -> ProfileData:
    loader = make_loader(
        dataset,
        batch_size=BATCH,
        sampler=Keys(len(dataset), (STEPS + 2) * BATCH),
        workers=workers,
        pin_memory=False,
        drop_last=True,
    )
    timeline = StepTimeline(profile, 0, "local")
    batches: Iterator[Any] = iter(loader)
    next(batches)  # workers started before the clock runs, as in a steady-state epoch
    for number in range(1, STEPS + 1):
        started, clock = time.perf_counter(), time.time()
        next(batches)
        wait = time.perf_counter() - started
        time.sleep(step)  # the emulated accelerator step
        timeline.record(step=number, epoch=0, start=clock, data_wait=wait, compute=step, communication=0.0, loss=1.0)
    timeline.close()
    return ProfileData.read(profile, loader={"workers": workers})


def test_a_starved_loader_is_named_and_the_default_one_is_not(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    write_scenes(tmp_path / "scenes", count=16, size=SIZE, seed=0)
    entries = read_manifest(next((tmp_path / "scenes" / "manifests").glob("*.jsonl")))
    dataset = SegmentationDataset(
        tmp_path / "scenes", entries, Augment(SIZE), decoder=ImageDecoder(pick_decoder("auto"))
    )
    started = time.perf_counter()
    for index in range(2 * BATCH):
        dataset[(index % len(dataset), augmentation_seed(0, 0, index))]
    step = 2.0 * (time.perf_counter() - started) / 2

    starved = _run(dataset, 0, step, tmp_path / "starved")
    [stall] = evaluate(starved, names=["DataStall"])
    assert stall.status == "IssuesFound", stall.evidence
    assert "0 workers" in stall.recommendation and "--workers" in stall.recommendation

    default = _run(dataset, 1, step, tmp_path / "default")
    [stall] = evaluate(default, names=["DataStall"])
    assert stall.status == "NoIssuesFound", (step, stall.evidence)
