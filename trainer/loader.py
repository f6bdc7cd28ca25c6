"""The input pipeline's process layout: how many loader workers, and how batches reach the device.

The rule the origin of this project taught: the accelerators must never wait for the CPUs. So, on
an accelerator host,
- every sample is decoded and augmented in a worker process, never in the training process,
  which only hands batches to the device (and launches its kernels);
- each training process gets the cores it owns (`os.sched_getaffinity`, divided among the
  processes of this host) minus one for itself, as workers, and every worker runs one thread
  (PyTorch's and OpenCV's pools would otherwise multiply into the hundreds and thrash);
- workers start from a fork server, never by forking the training process (`START_METHOD`), and
  persist across epochs (no restart, no re-import per epoch) and keep batches in flight,
  about `QUEUED_BATCHES` per process whatever the worker count (and at least PyTorch's default of
  two per worker), so one slow batch is absorbed by the queue instead of stalling the step, while
  shared memory (`/dev/shm`, small in some containers) holds a bounded number of batches;
- batches travel as uint8 (a quarter of float32's bytes through shared memory) into pinned host
  memory, from which the copy to the GPU is asynchronous; normalisation happens on the device.
On a CPU-only host the model trains on the same cores, so the default there is no worker at all:
a worker could only take a core from the model.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

# Batches in flight per training process, over all its workers (see the module docstring).
QUEUED_BATCHES = 8
# How workers start. Not by fork: when the loaders start, the training process runs threads (the
# profiler's sampler and rule threads, pin_memory's, NCCL's, OpenBLAS's), and a fork copies any
# lock one of them holds at that instant, held forever in the worker. A worker deadlocked so
# would stall the job while the heartbeats go on (Python 3.12 warns of it: "use of fork() may lead
# to deadlocks"). A fork server is a fresh single-threaded process the workers are forked from
# (each then imports torch itself, once, as workers persist); spawn where there is none. The
# dataset and everything it holds therefore travel to the workers pickled (tests/trainer/test_loader.py).
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def cores_available() -> int:
    """The cores this process may run on: a cpuset or taskset limit counts, a CPU quota does not."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_workers(local_world_size: int, accelerator: bool, cores: int | None = None) -> int:
    """Loader workers per training process: its share of the cores, less one for itself."""
    if not accelerator:
        return 0
    share = (cores or cores_available()) // max(1, local_world_size)
    # At least one: decoding in the training process would stall the accelerator every step.
    return max(1, share - 1)


def default_prefetch_factor(workers: int) -> int:
    """Batches each worker prepares ahead: QUEUED_BATCHES over all of them, at least two each."""
    return max(2, math.ceil(QUEUED_BATCHES / max(1, workers)))


def worker_init(worker_id: int) -> None:
    """Every worker runs single-threaded: its parallelism is being one of many workers.

    It also ignores SIGTERM and SIGINT, which torchrun sends to the whole process group: the
    training process finishes its step and checkpoints first (`stopping.py`), then shuts its
    workers down; a worker that died on the signal would fail that step instead.
    """
    del worker_id
    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    sampler: Sampler[Any],
    workers: int,
    pin_memory: bool,
    prefetch_factor: int = 0,
    drop_last: bool = False,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader[Any]:
    """A DataLoader laid out as the module docstring says (`prefetch_factor` 0: the default)."""
    parallel: dict[str, Any] = (
        {
            "persistent_workers": True,
            "multiprocessing_context": START_METHOD,
            "prefetch_factor": prefetch_factor or default_prefetch_factor(workers),
            "worker_init_fn": worker_init,
        }
        if workers > 0
        else {}
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        collate_fn=collate_fn,
        # A private generator: making an iterator then draws nothing from the global RNG, so a
        # run resumed mid-epoch continues the very same dropout stream.
        generator=torch.Generator(),
        **parallel,
    )
