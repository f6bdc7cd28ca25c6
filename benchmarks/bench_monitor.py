"""monitor_overhead_ratio: what the built-in system monitor costs a training step.

Step time of real training steps (BiSeNetV2, the offline width, forward + backward + SGD, both
cores) with the per-host sampler running at its default 500 ms over step time without it,
measured in one run: blocks of steps alternate off/on so that load from elsewhere on this shared
machine falls on both sides alike. Target: at most 1.02. Prints `name: value` lines.

    .venv/bin/python benchmarks/bench_monitor.py [--blocks 6] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.model import BiSeNetV2  # noqa: E402
from trainer.profiling.monitor import SystemMonitor  # noqa: E402


def step_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> float:
    images = torch.randn(4, 3, 128, 256)
    labels = torch.randint(0, 19, (4, 128, 256))
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        output = model(images)
        logits = output[0] if isinstance(output, (tuple, list)) else output
        F.cross_entropy(logits, labels).backward()
        optimizer.step()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=6, help="off/on block pairs")
    parser.add_argument("--steps", type=int, default=60, help="steps per block (several samples)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BiSeNetV2(num_classes=19, width=0.25)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_seconds(model, optimizer, 3)  # warm-up: allocator and kernels
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for block in range(args.blocks):
            print(f"block {block + 1}/{args.blocks}", file=sys.stderr)
            off.append(step_seconds(model, optimizer, args.steps))
            with SystemMonitor(Path(folder), interval_ms=500):
                on.append(step_seconds(model, optimizer, args.steps))
    ratio = statistics.median(b / a for a, b in zip(off, on, strict=True))
    print(f"monitor_step_seconds_off: {statistics.median(off):.4f}")
    print(f"monitor_step_seconds_on: {statistics.median(on):.4f}")
    print(f"monitor_overhead_ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
