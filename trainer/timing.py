"""Where a training step's time goes: waiting for data, computing, communicating.

Every optimizer step is split, per rank, into
- **data wait**: time blocked in `next()` on the loader (what a faster input pipeline wins back);
- **communication**: time spent only on the gradient all-reduce, after the backward pass had
  nothing left to compute (the *exposed* all-reduce: what faster networking or fewer ranks win
  back);
- **compute**: the rest (host-to-device copy, forward, backward, optimizer step).
The three add up to the step time. Alongside, `allreduce` is the whole time any all-reduce was in
flight, most of it hidden behind backward.

Why a communication hook: DDP all-reduces gradients in buckets *during* backward, as each bucket's
gradients become ready, so timing `backward()` mixes compute and communication, and timing a
separate all-reduce measures a different, unoverlapped operation. `AllReduceTimer` wraps DDP's
own default all-reduce (`allreduce_hook`, documented to leave DDP's results unchanged) in a hook
that marks when each bucket starts (its gradients are ready) and when its all-reduce completes
(the future's callback). On a GPU the marks are CUDA events on the streams involved (host clocks
would only see kernel launches, not the kernels); on CPU (gloo) they are host clock readings. Per
step: `allreduce` is the union of the buckets' intervals; `communication` is from the moment the
last bucket became ready (backward's compute was done) to the end of the last all-reduce.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

# A mark: a host clock reading (CPU) or a CUDA event (GPU).
Mark = Any


class AllReduceTimer:
    """Times DDP's gradient all-reduces, bucket by bucket, on this rank."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._intervals: list[tuple[Mark, Mark]] = []
        # The completion callback may run on the backend's thread (gloo) while this one reads.
        self._lock = threading.Lock()

    def attach(self, model: DistributedDataParallel) -> None:
        # A lambda: DDP inspects the hook's annotations and refuses any but the real classes,
        # while this module's annotations are strings (`from __future__ import annotations`).
        model.register_comm_hook(state=None, hook=lambda state, bucket: self._hook(state, bucket))  # noqa: PLW0108

    def _mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        # On the current stream: the backward kernels' stream at the start, and at the end the
        # stream the future's callback runs on, which is synchronised with the all-reduce.
        event.record()
        return event

    # `bucket` is a torch.distributed.GradBucket, a name the type stubs do not export.
    def _hook(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        started = self._mark()
        # state None: the default process group, as DDP's built-in all-reduce uses.
        future = default_hooks.allreduce_hook(state, bucket)

        def done(reduced: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            finished = self._mark()
            with self._lock:
                self._intervals.append((started, finished))
            return reduced.value()

        return future.then(done)

    def collect(self) -> tuple[float, float]:
        """(seconds any all-reduce was in flight, seconds of it exposed) since the last call.

        Call it after the step has synchronised with the device (the trainer's `loss.item()`).
        """
        with self._lock:
            intervals, self._intervals = self._intervals, []
        if not intervals:
            return 0.0, 0.0
        if self.cuda:
            for _, finished in intervals:
                finished.synchronize()
            origin = intervals[0][0]
            # Seconds relative to the first bucket's start; elapsed_time is in milliseconds.
            seconds = [
                (origin.elapsed_time(start) / 1000.0, origin.elapsed_time(end) / 1000.0) for start, end in intervals
            ]
        else:
            seconds = [(float(start), float(end)) for start, end in intervals]
        return _union(seconds), _exposed(seconds)


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _exposed(intervals: list[tuple[float, float]]) -> float:
    """From the last bucket's readiness (no gradient left to compute) to the last completion."""
    return max(0.0, max(end for _, end in intervals) - max(start for start, _ in intervals))


def attach_timer(model: torch.nn.Module, device: torch.device) -> AllReduceTimer | None:
    """A timer on a DDP model's all-reduces; None for a model that does not all-reduce."""
    if not isinstance(model, DistributedDataParallel):
        return None
    timer = AllReduceTimer(device)
    timer.attach(model)
    return timer


def split_step(step_seconds: float, wait_seconds: float, exposed_seconds: float) -> tuple[float, float, float]:
    """(data wait, compute, communication) of one step, adding up to `step_seconds`.

    Clocks of two kinds meet here (host, device), so the parts are clamped to fit the step.
    """
    wait = min(max(0.0, wait_seconds), step_seconds)
    communication = min(max(0.0, exposed_seconds), step_seconds - wait)
    return wait, step_seconds - wait - communication, communication


def fractions(
    step_seconds: float, wait_seconds: float, compute_seconds: float, communication_seconds: float
) -> dict[str, float]:
    """The three parts as fractions of the step time (all 0 before any step)."""
    if step_seconds <= 0:
        return {"stall_fraction": 0.0, "compute_fraction": 0.0, "communication_fraction": 0.0}
    return {
        "stall_fraction": min(1.0, wait_seconds / step_seconds),
        "compute_fraction": min(1.0, compute_seconds / step_seconds),
        "communication_fraction": min(1.0, communication_seconds / step_seconds),
    }
