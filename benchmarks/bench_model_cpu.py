"""The default model on this CPU: training images/s and peak memory at the full 1024x512 crop.

    .venv/bin/python benchmarks/bench_model_cpu.py [--steps 3] [--batch 2]

BiSeNetV2 at width 1.0 (the paper's network, as `--width` defaults) with its booster heads, on
random 1024x512 batches of 2 from memory, SGD; one warm-up step, then `--steps` timed ones
(forward, backward, optimizer step), with every core this process may use. Peak memory is the
process's maximum resident set size (`getrusage`), model, activations, gradients and all. Prints
`name: value` lines. It says what a CPU can do, not what a GPU host will: see
`benchmarks/gpu_benchmark.py` for that.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch

from trainer.loader import cores_available
from trainer.model import BiSeNetV2
from trainer.train import SegmentationLoss

CLASSES = 19
SIZE = (1024, 512)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(cores_available())
    torch.manual_seed(0)

    model = BiSeNetV2(CLASSES, width=1.0, aux=True)
    criterion = SegmentationLoss(aux_weight=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, 3, SIZE[1], SIZE[0])
    labels = torch.randint(0, CLASSES, (args.batch, SIZE[1], SIZE[0]))
    model.train()

    timed = 0.0
    for step in range(1 + args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        criterion(model(images), labels).backward()
        optimizer.step()
        seconds = time.perf_counter() - started
        print(f"step {step}: {seconds:.2f} s", file=sys.stderr)
        if step > 0:
            timed += seconds
    # Linux reports ru_maxrss in KiB.
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model_cpu_images_per_sec: {args.batch * args.steps / timed:.3f}")
    print(f"model_cpu_seconds_per_step: {timed / args.steps:.2f}")
    print(f"model_cpu_peak_rss_mib: {peak_mib:.0f}")
    print(f"model_parameters_with_booster_heads: {parameters}")
    print(f"input: {SIZE[0]}x{SIZE[1]}, batch {args.batch}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
