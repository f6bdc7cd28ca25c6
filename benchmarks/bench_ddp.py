"""How well does data-parallel training scale here? Two processes against one, and the all-reduce.

    .venv/bin/python benchmarks/bench_ddp.py [--steps 12] [--rounds 3] [--width 1.0]

The trainer's model (BiSeNetV2, default width 1.0: all 3.4 M parameters, so the all-reduce moves
the real gradient volume) on small inputs (256x128, batch 4 per process, booster heads on, SGD),
fed from memory so that only compute and communication are measured, one thread per process
(two processes x one thread is the layout that fits this machine's two cores). In one run,
interleaved per round: a single process without DDP, then two processes under DDP (gloo, the
trainer's `AllReduceTimer` on its all-reduces). Prints `name: value` lines, medians over rounds:
- `ddp_scaling_efficiency`: images/s of the two processes over twice the images/s of one
  (target >= 0.9);
- `allreduce_fraction`: time an all-reduce was in flight over step time (overlaps backward);
- `communication_fraction`: the exposed part (after backward had nothing left to compute).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from trainer.model import BiSeNetV2, SegmentationLoss
from trainer.timing import AllReduceTimer

CLASSES = 19
SIZE = (256, 128)
BATCH = 4
WARMUP = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def train_steps(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    """One process: WARMUP steps, then `args.steps` timed ones; puts (seconds, allreduce,
    exposed) on `out` (rank 0 only)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model: torch.nn.Module = BiSeNetV2(CLASSES, width=args.width, aux=True)
    timer = None
    if world > 1:
        model = DistributedDataParallel(model)
        timer = AllReduceTimer(torch.device("cpu"))
        timer.attach(model)
    criterion = SegmentationLoss(aux_weight=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(BATCH, 3, SIZE[1], SIZE[0], generator=generator)
    labels = torch.randint(0, CLASSES, (BATCH, SIZE[1], SIZE[0]), generator=generator)
    model.train()

    total = allreduce = exposed = 0.0
    for step in range(WARMUP + args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        criterion(model(images), labels).backward()
        optimizer.step()
        seconds = time.perf_counter() - started
        in_flight, hidden_not = timer.collect() if timer is not None else (0.0, 0.0)
        if step >= WARMUP:
            total, allreduce, exposed = total + seconds, allreduce + in_flight, exposed + hidden_not
    if world > 1:
        dist.destroy_process_group()
    if rank == 0:
        out.put((total, allreduce, exposed))


def measure(world: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(images/s of the whole job, all-reduce fraction, exposed fraction) for `world` processes."""
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    port = free_port()
    processes = [context.Process(target=train_steps, args=(rank, world, port, args, out)) for rank in range(world)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"a benchmark process failed with exit code {process.exitcode}")
    total, allreduce, exposed = out.get()
    images_per_sec = world * BATCH * args.steps / total
    return images_per_sec, allreduce / total, exposed / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=float, default=1.0, help="BiSeNetV2 width multiplier")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"

    efficiencies, allreduce, exposed, single, double = [], [], [], [], []
    for round_number in range(args.rounds):
        one, _, _ = measure(1, args)
        two, in_flight, not_hidden = measure(2, args)
        efficiencies.append(two / (2 * one))
        allreduce.append(in_flight)
        exposed.append(not_hidden)
        single.append(one)
        double.append(two)
        print(
            f"round {round_number + 1}: 1 process {one:.2f} images/s, 2 processes "
            f"{two:.2f} images/s, all-reduce {in_flight:.3f} of the step",
            file=sys.stderr,
        )
    print(f"ddp_scaling_efficiency: {statistics.median(efficiencies):.3f}")
    print(f"allreduce_fraction: {statistics.median(allreduce):.3f}")
    print(f"communication_fraction: {statistics.median(exposed):.3f}")
    print(f"images_per_sec_1_process: {statistics.median(single):.2f}")
    print(f"images_per_sec_2_processes: {statistics.median(double):.2f}")
    print(f"model_width: {args.width:g}")
    print(f"input: {SIZE[0]}x{SIZE[1]}, batch {BATCH} per process, 1 thread per process")


if __name__ == "__main__":
    main()
