"""Linear warm-up, then poly decay (power 0.9): the standard schedule for segmentation nets."""

from __future__ import annotations

from dataclasses import dataclass

from torch.optim.lr_scheduler import LambdaLR, LRScheduler


@dataclass
class WarmupPoly:
    """The learning-rate factor at an optimizer step, for `torch.optim.lr_scheduler.LambdaLR`.

    A callable object rather than a closure: LambdaLR saves an object's attributes in its state
    dict, so a resumed run can check it continues the same schedule.
    """

    total_steps: int
    warmup_steps: int
    power: float = 0.9
    # From-scratch nets with BatchNorm diverge easily at full rate; start warm-up at 10 %.
    warmup_start: float = 0.1

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {self.total_steps}")
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError(f"warmup_steps must be within [0, {self.total_steps}), got {self.warmup_steps}")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return float((1.0 - min(progress, 1.0)) ** self.power)


def default_warmup(total_steps: int) -> int:
    """5 % of the run, at most 1000 steps (the usual recipe's warm-up)."""
    return min(1000, total_steps // 20)


def move_to(scheduler: LRScheduler, step: int) -> None:
    """Put this job's LambdaLR at `step` of its own schedule, as if it had stepped there.

    For a resume under another world size or batch: the saved scheduler counted the other job's
    steps (and carries its total); this job's schedule continues from the same point of the run.
    """
    if not isinstance(scheduler, LambdaLR):
        raise TypeError(f"expected a LambdaLR, got {type(scheduler).__name__}")
    rates = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler.last_epoch = step
    # What get_last_lr() reports; step() would have set it.
    scheduler._last_lr = rates
