"""Does the input pipeline keep an accelerator fed? The loader against batches already in memory.

    .venv/bin/python benchmarks/bench_loader.py [--batches 40] [--rounds 3] [--workers N]

An accelerator is emulated by a fixed wait per batch (`time.sleep`, 150 ms per batch of 8 at
1024x512: about what this machine's two cores can decode, so the ratio measures the loader's
overhead rather than the machine's decode capacity) that leaves the CPUs free, as a GPU would.
On 1024x512 JPEG scenes with PNG masks (`retrain.synth.write_scenes`), augmented as in training
(random scale 0.5-2, 1024x512 crop, flip, jitter), one run measures, interleaved per round:
- the trainer's loader with its defaults for one process on an accelerator host (workers: the
  cores less one; decoder: the fastest installed; every file checked against the manifest's
  sha256, as `--verify-checksums` does by default), reading the files;
- the same batches, already in memory: the upper bound;
- the same dataset decoded in the training process (0 workers), as a naive loader does.
Each loop is one steady-state epoch of `--batches` batches (the workers are started, by a short
warm-up epoch, before the clock runs). Prints `name: value` lines: the median over rounds of
`loader_vs_memory_ratio` (target <= 1.05) and `naive_loader_ratio`, and what they ran with,
including `sample_sha256_ms`, the checksums' share of `sample_cpu_ms` (`--no-verify`: without).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

from retrain.synth import write_scenes
from trainer.data import (
    Augment,
    SampleKey,
    SegmentationDataset,
    augmentation_seed,
    read_manifest,
)
from trainer.decode import ImageDecoder, pick_decoder
from trainer.loader import (
    cores_available,
    default_prefetch_factor,
    default_workers,
    make_loader,
)

SIZE = (1024, 512)
BATCH = 8


class EpochSampler(Sampler[SampleKey]):
    """`samples` keys over the dataset, in a shuffled order, a fresh augmentation per epoch."""

    def __init__(self, length: int, samples: int) -> None:
        super().__init__()
        self.length, self.samples, self.epoch = length, samples, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[SampleKey]:
        order = random.Random(self.epoch).sample(range(self.samples), self.samples)
        return iter([(i % self.length, augmentation_seed(0, self.epoch, i)) for i in order])

    def __len__(self) -> int:
        return self.samples


def run_epoch(batches: Iterable[Any], step_seconds: float) -> float:
    """Seconds for one pass: fetch a batch, then 'compute' (sleep) for the emulated step."""
    started = time.perf_counter()
    for _ in batches:
        time.sleep(step_seconds)
    return time.perf_counter() - started


def sample_costs(dataset: SegmentationDataset) -> tuple[float, float]:
    """CPU ms per sample: all of it (read, check, decode, augment), and its two SHA-256s alone."""
    started = time.process_time()
    for index in range(len(dataset)):
        dataset[(index, augmentation_seed(0, 0, index))]
    sample_ms = 1000 * (time.process_time() - started) / len(dataset)
    files = [(dataset.root / path).read_bytes() for entry in dataset.entries for path in (entry.image, entry.label)]
    started = time.process_time()
    for data in files:
        hashlib.sha256(data).hexdigest()
    return sample_ms, 1000 * (time.process_time() - started) / len(dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40, help="batches per measured epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=150.0, help="emulated step per batch")
    parser.add_argument("--scenes", type=int, default=96, help="distinct scenes on disk")
    parser.add_argument("--workers", type=int, default=-1, help="-1: the trainer's default")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not check the files against the manifest's sha256 (the trainer checks by default)",
    )
    args = parser.parse_args()
    step = args.step_ms / 1000.0
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as folder:
        root = Path(folder)
        print(f"drawing {args.scenes} scenes of {SIZE[0]}x{SIZE[1]}...", file=sys.stderr)
        write_scenes(root, count=args.scenes, size=SIZE, seed=0)
        entries = read_manifest(next((root / "manifests").glob("*.jsonl")))
        decoder = ImageDecoder(pick_decoder("auto"))
        dataset = SegmentationDataset(root, entries, Augment(SIZE), decoder=decoder, verify=not args.no_verify)
        samples = args.batches * BATCH

        workers = args.workers if args.workers >= 0 else default_workers(local_world_size=1, accelerator=True)
        sampler = EpochSampler(len(dataset), samples)
        loader = make_loader(
            dataset,
            batch_size=BATCH,
            sampler=sampler,
            workers=workers,
            pin_memory=torch.cuda.is_available(),
            drop_last=True,
        )
        naive_sampler = EpochSampler(len(dataset), samples)
        naive = make_loader(
            dataset,
            batch_size=BATCH,
            sampler=naive_sampler,
            workers=0,
            pin_memory=False,
            drop_last=True,
        )

        # Start the persistent workers (fork, imports) before any clock runs.
        sampler.set_epoch(1000)
        for index, _ in enumerate(loader):
            if index == 1:
                break

        ratios, naive_ratios = [], []
        for round_number in range(args.rounds):
            sampler.set_epoch(round_number)
            in_memory = list(loader)  # the very batches the loader makes this epoch
            sampler.set_epoch(round_number)
            from_files = run_epoch(loader, step)
            from_memory = run_epoch(in_memory, step)
            naive_sampler.set_epoch(round_number)
            decoded_here = run_epoch(naive, step)
            ratios.append(from_files / from_memory)
            naive_ratios.append(decoded_here / from_memory)
            print(
                f"round {round_number + 1}: loader {from_files:.2f} s, memory "
                f"{from_memory:.2f} s, naive {decoded_here:.2f} s",
                file=sys.stderr,
            )

        decode_ms, sha256_ms = sample_costs(dataset)
        assert dataset.checksums is None or not int(dataset.checksums.flags.gt(1).sum()), "a file differs"

    print(f"loader_vs_memory_ratio: {statistics.median(ratios):.3f}")
    print(f"naive_loader_ratio: {statistics.median(naive_ratios):.3f}")
    print(f"loader_workers: {workers}")
    print(f"loader_prefetch_factor: {default_prefetch_factor(workers)}")
    print(f"cores: {cores_available()}")
    print(f"decoder: {decoder.name}")
    print(f"emulated_step_ms: {args.step_ms:g}")
    print(f"sample_cpu_ms: {decode_ms:.1f}")
    print(f"checksums: {'off' if args.no_verify else 'on'}")
    print(f"sample_sha256_ms: {sha256_ms:.2f}")


if __name__ == "__main__":
    main()
