"""The default model on one GPU: bf16 training images/s, GPU utilization, and the loader's stall.

    python benchmarks/gpu_benchmark.py [--batch 16] [--seconds 45] [--loader-steps 150]

Needs a CUDA GPU and refuses clearly without one (it is not a `bench_*` file, so `make bench`
does not run it). About 3-5 minutes on one H200; the phases, in one run:
1. **Model**: BiSeNetV2 at width 1.0 (the trainer's default) with its booster heads, 1024x512
   batches from GPU memory, bf16 autocast, channels-last, SGD: warm-up, then `--seconds` of
   timed, synchronised steps -> `gpu_images_per_sec`, and the GPU utilization NVML reports while
   they run (via `torch.cuda.utilization`, which needs nvidia-ml-py; else `nvidia-smi`; else it
   says it cannot tell). NVML's utilization is the share of time *any* kernel ran, not how full
   the GPU was: a sanity check, not a roofline.
2. **Input pipeline**: 1024x512 JPEG scenes with PNG masks (`retrain.synth`), the trainer's loader
   with its defaults for one process on this host (workers = cores less one, pinned memory, the
   fastest decoder installed, every file checked against the manifest's sha256, random
   scale/crop/flip/jitter) feeding the same training step, then
   the very same batches from pinned host memory, the upper bound. The stall fraction is the time
   blocked on the loader over step time, exactly as the trainer reports it ->
   `gpu_loader_stall_fraction`, `gpu_memory_stall_fraction` (~0) and `gpu_loader_vs_memory_ratio`
   (step time with the loader over step time from memory; 1.0 is a loader that never starves).
Prints `name: value` lines to stdout, progress to stderr. Run it from the repository root with
the project installed (it imports `trainer` and `retrain.synth`).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

from retrain.synth import write_scenes
from trainer.data import (
    Augment,
    SegmentationDataset,
    augmentation_seed,
    read_manifest,
    to_device,
)
from trainer.decode import ImageDecoder, pick_decoder
from trainer.loader import cores_available, default_workers, make_loader
from trainer.model import BiSeNetV2, SegmentationLoss

SIZE = (1024, 512)
CLASSES = 19
EXIT_NO_GPU = 2


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class UtilizationSampler:
    """GPU utilization (%) sampled in the background: NVML through torch, else nvidia-smi."""

    def __init__(self, device: torch.device, interval: float = 0.2) -> None:
        self.device, self.interval = device, interval
        self.samples: list[float] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._smi: subprocess.Popen[str] | None = None

    def start(self) -> None:
        try:
            torch.cuda.utilization(self.device)  # needs pynvml (the nvidia-ml-py package)
            self.source = "nvml"
            self._thread = threading.Thread(target=self._poll_nvml, daemon=True)
        except Exception:  # no pynvml, or NVML refuses: any failure means "try nvidia-smi"
            smi = shutil.which("nvidia-smi")
            if smi is None:
                return
            self.source = "nvidia-smi"
            index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
            self._smi = subprocess.Popen(
                [
                    smi,
                    "--query-gpu=utilization.gpu",
                    "--format=csv,noheader,nounits",
                    "-i",
                    index,
                    "-lms",
                    str(int(self.interval * 1000)),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._thread = threading.Thread(target=self._read_smi, daemon=True)
        self._thread.start()

    def _poll_nvml(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(float(torch.cuda.utilization(self.device)))

    def _read_smi(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        for line in self._smi.stdout:
            if self._stop.is_set():
                break
            if line.strip().isdigit():
                self.samples.append(float(line))

    def stop(self) -> str:
        """The mean utilization as text, or why there is none."""
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.source == "none":
            return "unknown (neither nvidia-ml-py nor nvidia-smi available)"
        if not self.samples:
            return f"unknown (no samples from {self.source})"
        return f"{statistics.mean(self.samples):.1f}% ({self.source}, {len(self.samples)} samples)"


class EpochSampler(Sampler[tuple[int, int]]):
    """`samples` (index, augmentation seed) keys over a small dataset, shuffled per epoch."""

    def __init__(self, length: int, samples: int) -> None:
        super().__init__()
        self.length, self.samples, self.epoch = length, samples, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = random.Random(self.epoch).sample(range(self.samples), self.samples)
        return iter([(i % self.length, augmentation_seed(0, self.epoch, i)) for i in order])

    def __len__(self) -> int:
        return self.samples


def make_step(device: torch.device) -> tuple[Callable[[torch.Tensor, torch.Tensor], float], int]:
    """A training step of the default model (uint8 batch in, loss out), and its parameters."""
    model = BiSeNetV2(CLASSES, width=1.0, aux=True).to(device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    criterion = SegmentationLoss(aux_weight=1.0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    model.train()

    def step(raw_images: torch.Tensor, raw_labels: torch.Tensor) -> float:
        images, labels = to_device(raw_images, raw_labels, device, channels_last=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        # Synchronises with the GPU, as the trainer's loss.item() does every step.
        return float(loss.item())

    return step, sum(p.numel() for p in model.parameters())


def model_throughput(
    step: Callable[[torch.Tensor, torch.Tensor], float],
    batch: int,
    seconds: float,
    device: torch.device,
) -> tuple[float, str]:
    """(images/s, utilization) of the step on random uint8 batches already on the GPU."""
    images = torch.randint(0, 256, (batch, 3, SIZE[1], SIZE[0]), dtype=torch.uint8, device=device)
    labels = torch.randint(0, CLASSES, (batch, SIZE[1], SIZE[0]), dtype=torch.uint8, device=device)
    for _ in range(15):  # cudnn autotuning, allocator warm-up
        step(images, labels)
    sampler = UtilizationSampler(device)
    sampler.start()
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step(images, labels)
        steps += 1
    elapsed = time.perf_counter() - started
    return steps * batch / elapsed, sampler.stop()


def timed_epoch(
    step: Callable[[torch.Tensor, torch.Tensor], float], batches: Iterable[Any]
) -> tuple[float, float, int]:
    """(seconds, seconds blocked waiting for the next batch, batches) for one pass."""
    waited, count = 0.0, 0
    iterator = iter(batches)
    started = time.perf_counter()
    while True:
        before = time.perf_counter()
        try:
            images, labels = next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - before
        step(images, labels)
        count += 1
    return time.perf_counter() - started, waited, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="images per step (one GPU)")
    parser.add_argument("--seconds", type=float, default=45.0, help="timed model phase")
    parser.add_argument("--loader-steps", type=int, default=150, help="steps per loader pass")
    parser.add_argument("--scenes", type=int, default=128, help="distinct scenes on disk")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_benchmark.py needs a CUDA GPU and this machine has none "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); "
            "the CPU benchmarks are `make bench`",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_NO_GPU)

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device)
    log(f"{name}: model phase ({args.seconds:g} s)...")
    step, parameters = make_step(device)
    images_per_sec, utilization = model_throughput(step, args.batch, args.seconds, device)
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as folder:
        root = Path(folder)
        log(f"drawing {args.scenes} scenes of {SIZE[0]}x{SIZE[1]}...")
        write_scenes(root, count=args.scenes, size=SIZE, seed=0)
        entries = read_manifest(next((root / "manifests").glob("*.jsonl")))
        decoder = ImageDecoder(pick_decoder("auto"))
        dataset = SegmentationDataset(root, entries, Augment(SIZE), decoder=decoder, verify=True)
        workers = default_workers(local_world_size=1, accelerator=True)
        sampler = EpochSampler(len(dataset), args.loader_steps * args.batch)
        loader = make_loader(
            dataset,
            batch_size=args.batch,
            sampler=sampler,
            workers=workers,
            pin_memory=True,
            drop_last=True,
        )
        log(f"loader phase: {workers} workers, decoder {decoder.name}...")
        sampler.epoch = 1000
        timed_epoch(step, loader)  # starts the persistent workers; warms the page cache
        sampler.epoch = 0
        in_memory = [(i.pin_memory(), lbl.pin_memory()) for i, lbl in loader]
        sampler.epoch = 0
        loader_seconds, loader_wait, steps = timed_epoch(step, loader)
        memory_seconds, memory_wait, _ = timed_epoch(step, in_memory)

    print(f"gpu: {name}")
    print(f"gpu_images_per_sec: {images_per_sec:.1f}")
    print(f"gpu_utilization: {utilization}")
    print(f"gpu_peak_memory_gib: {peak_gib:.1f}")
    print(f"gpu_loader_stall_fraction: {loader_wait / loader_seconds:.4f}")
    print(f"gpu_memory_stall_fraction: {memory_wait / memory_seconds:.4f}")
    print(f"gpu_loader_vs_memory_ratio: {loader_seconds / memory_seconds:.3f}")
    print(f"gpu_loader_images_per_sec: {steps * args.batch / loader_seconds:.1f}")
    print(f"gpu_memory_images_per_sec: {steps * args.batch / memory_seconds:.1f}")
    print(f"loader_workers: {workers}")
    print(f"cores: {cores_available()}")
    print(f"decoder: {decoder.name}")
    print(f"model_parameters_with_booster_heads: {parameters}")
    print(f"input: {SIZE[0]}x{SIZE[1]}, batch {args.batch}, bf16 autocast, channels-last")


if __name__ == "__main__":
    main()
