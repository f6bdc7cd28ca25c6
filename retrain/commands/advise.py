"""`retrain advise`: how many instances (and GPUs) reach a target epoch time, at what cost.

    retrain advise --throughput 29.24 --efficiency 0.9 --dataset-size 100000 \\
        --target-epoch-minutes 6 --stall-fraction 0.5
    retrain advise --from-metrics runs/train/output/metrics.json --efficiency 0.9 \\
        --target-epoch-minutes 6 --instance-type ml.p5.48xlarge

The model and the price table are in `retrain/advisor.py`. `--json` prints the answer as one
document (`AdviseReport`: the measurement, every plan of the table, both verdicts).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from functions.common.contracts import MetricsFile
from retrain.advisor import (
    DEFAULT_INSTANCE_TYPE,
    INSTANCE_TYPES,
    MAX_INSTANCES,
    PRICES_AS_OF,
    PRICES_SOURCE,
    Advice,
    Measurement,
    Plan,
    advise,
    epoch_minutes_measured,
    plan_for,
)
from retrain.commands.checks import finite, positive
from retrain.commands.options import JsonOption, print_json


@dataclass(frozen=True)
class AdviseReport:
    """What `retrain advise` answers (`--json` prints it whole): the measurement, the table of
    instance counts, and the fewest instances that reach the target, as measured and with the
    loader fixed."""

    measurement: Measurement
    dataset_size: int
    measured_epoch_minutes: float  # what the measurement's own GPUs take per epoch
    efficiency: float
    target_epoch_minutes: float
    instance_type: str
    gpus_per_instance: int
    price_per_hour: float
    price_source: str  # "given", or where the table's price is from and when
    plans: list[Plan]  # as measured, by instance count
    as_measured: Advice  # its plan is None: the target is out of reach within max_instances
    loader_fixed: Advice | None  # only for a measurement that stalled
    max_instances: int = MAX_INSTANCES


def from_metrics(path: Path) -> tuple[Measurement, int, str]:
    """(measurement, training images, device) from a run's metrics.json: median epoch, all ranks."""
    try:
        metrics = MetricsFile.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValidationError) as error:
        raise typer.BadParameter(
            f"{path} is not a run's metrics.json: {_first_line(error)}", param_hint="--from-metrics"
        ) from error
    if not metrics.epochs:
        raise typer.BadParameter(f"{path} has no finished epoch to measure", param_hint="metrics")
    # The median epoch: the first one carries warm-up (cudnn autotuning, worker start-up).
    measurement = Measurement(
        images_per_sec=statistics.median(epoch.images_per_sec for epoch in metrics.epochs),
        # One process per GPU under torchrun, so the world size is the GPU count.
        gpus=metrics.host.world_size,
        stall_fraction=statistics.median(epoch.stall_fraction for epoch in metrics.epochs),
    )
    return measurement, metrics.train_images, metrics.host.device


def _first_line(error: Exception) -> str:
    """pydantic's message is a paragraph: its first error is enough to recognise the wrong file."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(error)


def command(
    *,
    efficiency: Annotated[
        float,
        typer.Option(callback=finite, help="Scaling efficiency per doubling of GPUs, within (0.5, 1]; e.g. 0.9."),
    ],
    target_epoch_minutes: Annotated[
        float, typer.Option(min=0.001, callback=finite, help="The epoch time to reach, in minutes.")
    ],
    throughput: Annotated[
        float | None,
        typer.Option(callback=positive, help="Measured images/s of the whole job (all its GPUs together)."),
    ] = None,
    dataset_size: Annotated[int | None, typer.Option(min=1, help="Training images per epoch.")] = None,
    measured_gpus: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs the throughput was measured on (default: one instance)."),
    ] = None,
    stall_fraction: Annotated[
        float | None,
        typer.Option(min=0.0, max=0.99, help="The run's stall fraction (data wait / step time)."),
    ] = None,
    from_metrics_file: Annotated[
        Path | None,
        typer.Option(
            "--from-metrics",
            exists=True,
            dir_okay=False,
            help="A run's metrics.json: throughput, GPUs, stall and dataset size from it.",
        ),
    ] = None,
    instance_type: Annotated[str, typer.Option(help=f"One of: {', '.join(INSTANCE_TYPES)}.")] = DEFAULT_INSTANCE_TYPE,
    gpus_per_instance: Annotated[
        int | None, typer.Option(min=1, help="GPUs per instance (default: the type's).")
    ] = None,
    price_per_hour: Annotated[
        float | None,
        typer.Option(min=0.0, callback=finite, help="USD per instance-hour (default: the table's list price)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print how many instances reach the target epoch time, and what one epoch costs.

    Model: images/s on n GPUs = n x (one GPU's images/s) x efficiency^log2(n).

    With a stall fraction s, it also answers for the job with its loader fixed (1/(1-s) faster).
    """
    known = INSTANCE_TYPES.get(instance_type)
    if known is None and (gpus_per_instance is None or price_per_hour is None):
        raise typer.BadParameter(
            f"{instance_type} is not in the price table ({', '.join(INSTANCE_TYPES)}): "
            "give --gpus-per-instance and --price-per-hour",
            param_hint="--instance-type",
        )
    gpus = gpus_per_instance or (known.gpus if known else 1)
    price = price_per_hour if price_per_hour is not None else (known.price_per_hour if known else 0)
    price_note = "given" if price_per_hour is not None else f"{PRICES_SOURCE}, {PRICES_AS_OF}"

    if from_metrics_file is not None:
        measurement, run_images, device = from_metrics(from_metrics_file)
        dataset_size = dataset_size or run_images
        if device != "cuda":
            typer.echo(f"note: {from_metrics_file} was measured on {device} processes, not GPUs", err=as_json)
        if stall_fraction is not None or measured_gpus is not None or throughput is not None:
            measurement = Measurement(
                throughput or measurement.images_per_sec,
                measured_gpus or measurement.gpus,
                measurement.stall_fraction if stall_fraction is None else stall_fraction,
            )
    else:
        if throughput is None or dataset_size is None:
            raise typer.BadParameter("give --throughput and --dataset-size, or --from-metrics")
        measurement = Measurement(throughput, measured_gpus or gpus, stall_fraction or 0.0)
    assert dataset_size is not None

    advice_for = functools.partial(
        advise,
        measurement,
        efficiency=efficiency,
        dataset_size=dataset_size,
        target_epoch_minutes=target_epoch_minutes,
        gpus_per_instance=gpus,
        price_per_hour=price,
    )
    try:
        as_measured = advice_for()
        fixed = advice_for(speedup=measurement.loader_speedup) if measurement.stall_fraction else None
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error

    counts = sorted({1, 2, 4, 8, 16, 32, 64} | _chosen(as_measured) | _chosen(fixed))
    report = AdviseReport(
        measurement=measurement,
        dataset_size=dataset_size,
        measured_epoch_minutes=epoch_minutes_measured(measurement, dataset_size),
        efficiency=efficiency,
        target_epoch_minutes=target_epoch_minutes,
        instance_type=instance_type,
        gpus_per_instance=gpus,
        price_per_hour=price,
        price_source=price_note,
        plans=[
            plan_for(
                count,
                per_gpu=as_measured.per_gpu_images_per_sec,
                efficiency=efficiency,
                dataset_size=dataset_size,
                gpus_per_instance=gpus,
                price_per_hour=price,
            )
            for count in counts
        ],
        as_measured=as_measured,
        loader_fixed=fixed,
    )
    if as_json:
        print_json(report)
    else:
        _print(report)


def _print(report: AdviseReport) -> None:
    echo = typer.echo
    measurement, target = report.measurement, report.target_epoch_minutes
    echo(
        f"measured: {measurement.images_per_sec:.1f} images/s on {measurement.gpus} GPUs "
        f"({report.measured_epoch_minutes:.1f} min per epoch of "
        f"{report.dataset_size} images), stall fraction {measurement.stall_fraction:.2f}"
    )
    echo(
        f"model: images/s on n GPUs = n x {report.as_measured.per_gpu_images_per_sec:.2f} "
        f"x {report.efficiency:g}^log2(n)"
    )
    echo(
        f"instance: {report.instance_type}, {report.gpus_per_instance} GPUs, ${report.price_per_hour:.3f} "
        f"per hour ({report.price_source})"
    )
    echo("\nas measured, by instance count:")
    echo(f"{'instances':>9} {'GPUs':>5} {'images/s':>9} {'min/epoch':>9} {'$/epoch':>9}")
    for plan in report.plans:
        echo(
            f"{plan.instances:>9} {plan.gpus:>5} {plan.images_per_sec:>9.1f} "
            f"{plan.epoch_minutes:>9.2f} {plan.cost_per_epoch:>9.2f}"
        )
    echo("")
    echo(_verdict("as measured", report.as_measured, report.instance_type, target))
    fixed = report.loader_fixed
    if fixed is not None:
        label = f"loader fixed ({fixed.speedup:.2f}x: no stall)"
        echo(_verdict(label, fixed, report.instance_type, target))


def _chosen(advice: Advice | None) -> set[int]:
    return {advice.plan.instances} if advice is not None and advice.plan is not None else set()


def _verdict(label: str, advice: Advice, instance_type: str, target: float) -> str:
    plan = advice.plan
    if plan is None:
        best = advice.closest
        return (
            f"{label}: {target:g} min per epoch is out of reach within {MAX_INSTANCES} "
            f"instances ({best.epoch_minutes:.1f} min on {best.instances}); lower the "
            "target, fix the input pipeline, or raise the per-GPU throughput"
        )
    return (
        f"{label}: {plan.instances} x {instance_type} ({plan.gpus} GPUs) -> "
        f"{plan.epoch_minutes:.2f} min per epoch, {plan.images_per_sec:.0f} images/s, "
        f"${plan.cost_per_epoch:.2f} per epoch"
    )
