"""How many instances reach a target epoch time, and what one epoch costs: the scaling advisor.

The model is deliberately simple, and stated so that a user can argue with it:

    images/s on n GPUs = n * x1 * e ** log2(n)

where `x1` is one GPU's throughput and `e` the scaling efficiency per doubling: every doubling of
the GPU count keeps the fraction `e` of the ideal gain (gradient all-reduce and stragglers eat the
rest). `e = 1` is linear scaling; `e = 0.9` means 8 GPUs do 8 * 0.9**3 = 5.8 GPUs' work. A
throughput measured on `m` GPUs gives `x1 = measured / (m * e ** log2(m))`. For `e <= 0.5` more
GPUs never help (n * e**log2(n) = n ** (1 + log2 e) stops growing), so the model refuses such `e`.

A loader that starves the GPUs shows as a stall fraction `s` (time waiting on data over step
time, what the trainer reports): removing the stall makes each step `1 / (1 - s)` times faster,
so a run that waited half of every step (`s = 0.5`) can gain 2x from its loader alone. The
advisor therefore answers twice when it knows the stall: as measured, and with the loader fixed.

Prices are on-demand list prices per instance-hour of SageMaker *training* instances in US East
(N. Virginia), from the AWS SageMaker AI pricing page (https://aws.amazon.com/sagemaker/pricing/,
"On-Demand Pricing", "Training" tab) as recorded in `PRICES_AS_OF`. Prices change (AWS cut several
GPU instance prices in 2025) and differ by region: check the page, and pass `--price-per-hour`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from functions.common.prices import PRICES_AS_OF, PRICES_SOURCE, TRAINING_PRICE_PER_HOUR

__all__ = ["PRICES_AS_OF", "PRICES_SOURCE"]

# No scaling plan grows past this many instances: beyond it a target is called unreachable.
MAX_INSTANCES = 64


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu: str
    price_per_hour: float  # USD, on-demand, SageMaker training, us-east-1


INSTANCE_TYPES: dict[str, InstanceType] = {
    item.name: item
    for item in (
        InstanceType("ml.p3.16xlarge", 8, "V100 16 GB", TRAINING_PRICE_PER_HOUR["ml.p3.16xlarge"]),
        InstanceType("ml.p4d.24xlarge", 8, "A100 40 GB", TRAINING_PRICE_PER_HOUR["ml.p4d.24xlarge"]),
        InstanceType("ml.p4de.24xlarge", 8, "A100 80 GB", TRAINING_PRICE_PER_HOUR["ml.p4de.24xlarge"]),
        InstanceType("ml.p5.48xlarge", 8, "H100 80 GB", TRAINING_PRICE_PER_HOUR["ml.p5.48xlarge"]),
        InstanceType("ml.g5.48xlarge", 8, "A10G 24 GB", TRAINING_PRICE_PER_HOUR["ml.g5.48xlarge"]),
        InstanceType("ml.g6e.48xlarge", 8, "L40S 48 GB", TRAINING_PRICE_PER_HOUR["ml.g6e.48xlarge"]),
    )
}
DEFAULT_INSTANCE_TYPE = "ml.p4d.24xlarge"


@dataclass(frozen=True)
class Measurement:
    """What a run measured: its whole-job throughput, on how many GPUs, and how much it stalled."""

    images_per_sec: float
    gpus: int
    stall_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.images_per_sec <= 0:
            raise ValueError(f"throughput must be positive, got {self.images_per_sec}")
        if self.gpus < 1:
            raise ValueError(f"a measurement needs at least one GPU, got {self.gpus}")
        if not 0.0 <= self.stall_fraction < 1.0:
            raise ValueError(f"a stall fraction is within [0, 1), got {self.stall_fraction}")

    @property
    def loader_speedup(self) -> float:
        """How much faster each step gets once the loader never makes it wait: 1 / (1 - s)."""
        return 1.0 / (1.0 - self.stall_fraction)


@dataclass(frozen=True)
class Plan:
    """One configuration: how many instances, and what an epoch takes and costs on them."""

    instances: int
    gpus: int
    images_per_sec: float
    epoch_minutes: float
    cost_per_epoch: float  # USD

    def reaches(self, target_minutes: float) -> bool:
        # A hair of tolerance: 57 min / 9.5 must count as reaching 6 min, whatever the rounding.
        return self.epoch_minutes <= target_minutes * (1 + 1e-9)


@dataclass(frozen=True)
class Advice:
    """The smallest plan that reaches the target (None if none within MAX_INSTANCES)."""

    speedup: float
    per_gpu_images_per_sec: float
    plan: Plan | None
    closest: Plan  # the plan reaching the target, or the fastest one tried


def check_efficiency(efficiency: float) -> None:
    if not 0.5 < efficiency <= 1.0:
        raise ValueError(
            f"scaling efficiency per doubling must be within (0.5, 1], got {efficiency}: at 0.5 "
            "or below, adding GPUs would not make an epoch any faster"
        )


def scaled_throughput(per_gpu: float, gpus: int, efficiency: float) -> float:
    """Images/s on `gpus` GPUs: n * x1 * e ** log2(n)."""
    check_efficiency(efficiency)
    return gpus * per_gpu * math.pow(efficiency, math.log2(gpus))


def per_gpu_throughput(measurement: Measurement, efficiency: float) -> float:
    """One GPU's throughput implied by a measurement on several: the model, inverted."""
    return measurement.images_per_sec / scaled_throughput(1.0, measurement.gpus, efficiency)


def plan_for(
    instances: int,
    *,
    per_gpu: float,
    efficiency: float,
    dataset_size: int,
    gpus_per_instance: int,
    price_per_hour: float,
) -> Plan:
    gpus = instances * gpus_per_instance
    images_per_sec = scaled_throughput(per_gpu, gpus, efficiency)
    minutes = dataset_size / images_per_sec / 60.0
    return Plan(
        instances=instances,
        gpus=gpus,
        images_per_sec=images_per_sec,
        epoch_minutes=minutes,
        cost_per_epoch=instances * price_per_hour * minutes / 60.0,
    )


def advise(
    measurement: Measurement,
    *,
    efficiency: float,
    dataset_size: int,
    target_epoch_minutes: float,
    gpus_per_instance: int,
    price_per_hour: float,
    speedup: float = 1.0,
    max_instances: int = MAX_INSTANCES,
) -> Advice:
    """The fewest instances whose epoch takes at most `target_epoch_minutes`.

    `speedup` multiplies every GPU's throughput (e.g. `measurement.loader_speedup`, for a run
    whose loader no longer stalls it). The fewest instances that reach the target are also the
    cheapest plan that does: an epoch's cost grows with the count k as k ** -log2(e) (flat only
    at e = 1), because each added GPU does a little less than the one before.
    """
    check_efficiency(efficiency)
    if dataset_size < 1 or target_epoch_minutes <= 0 or gpus_per_instance < 1:
        raise ValueError("dataset size, target minutes and GPUs per instance must be positive")
    if speedup <= 0 or price_per_hour < 0:
        raise ValueError("the speed-up must be positive and the price not negative")
    per_gpu = per_gpu_throughput(measurement, efficiency) * speedup
    plans = (
        plan_for(
            count,
            per_gpu=per_gpu,
            efficiency=efficiency,
            dataset_size=dataset_size,
            gpus_per_instance=gpus_per_instance,
            price_per_hour=price_per_hour,
        )
        for count in range(1, max_instances + 1)
    )
    closest: Plan | None = None
    for plan in plans:
        closest = plan
        if plan.reaches(target_epoch_minutes):
            return Advice(speedup, per_gpu, plan, plan)
    assert closest is not None
    return Advice(speedup, per_gpu, None, closest)


def epoch_minutes_measured(measurement: Measurement, dataset_size: int) -> float:
    return dataset_size / measurement.images_per_sec / 60.0
