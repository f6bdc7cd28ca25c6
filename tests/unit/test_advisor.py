"""An engineer asks how many instances a target epoch time needs, and what an epoch costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from retrain.advisor import (
    INSTANCE_TYPES,
    Measurement,
    advise,
    per_gpu_throughput,
    scaled_throughput,
)
from retrain.commands import advise as advise_command

# The origin team: 57 minutes per epoch on one 8-GPU instance (p4d), target 6 minutes; their
# custom loader left the GPUs waiting half of every step, and fixing it doubled the speed.
DATASET = 100_000
ORIGIN = Measurement(images_per_sec=DATASET / (57 * 60), gpus=8, stall_fraction=0.5)
P4D = INSTANCE_TYPES["ml.p4d.24xlarge"]


def _origin(speedup: float = 1.0, efficiency: float = 0.9) -> tuple[int, float, float]:
    advice = advise(
        ORIGIN,
        efficiency=efficiency,
        dataset_size=DATASET,
        target_epoch_minutes=6,
        gpus_per_instance=P4D.gpus,
        price_per_hour=P4D.price_per_hour,
        speedup=speedup,
    )
    assert advice.plan is not None, "6 minutes must be reachable for the origin team"
    return advice.plan.instances, advice.plan.epoch_minutes, advice.plan.cost_per_epoch


def test_the_origin_team_needs_half_the_instances_once_its_loader_is_fixed() -> None:
    without_fix, minutes, cost = _origin()
    with_fix, fixed_minutes, fixed_cost = _origin(speedup=ORIGIN.loader_speedup)
    assert ORIGIN.loader_speedup == pytest.approx(2.0), "stall 0.5 means 2x from the loader"
    # 57 / 6 = 9.5x: at 0.9 per doubling, k instances give k * 0.9**log2(k) times one instance.
    assert without_fix == 15, f"without the fix: {without_fix} instances"
    assert with_fix == 7, f"with the 2x fix: {with_fix} instances ('several', as in the story)"
    assert minutes <= 6 and fixed_minutes <= 6
    assert fixed_cost < cost / 2, "the loader fix must also more than halve the cost per epoch"


def test_more_efficient_scaling_needs_fewer_instances() -> None:
    assert _origin(speedup=2.0, efficiency=0.95)[0] == 6
    assert _origin(speedup=2.0, efficiency=1.0)[0] == 5, "4.75x needs 5 instances at best"


def test_a_throughput_measured_on_eight_gpus_is_scaled_back_to_one() -> None:
    per_gpu = per_gpu_throughput(ORIGIN, efficiency=0.9)
    assert scaled_throughput(per_gpu, 8, 0.9) == pytest.approx(ORIGIN.images_per_sec)
    assert per_gpu == pytest.approx(ORIGIN.images_per_sec / (8 * 0.9**3))


def test_an_unreachable_target_says_how_close_it_gets() -> None:
    advice = advise(
        ORIGIN,
        efficiency=0.6,
        dataset_size=DATASET,
        target_epoch_minutes=0.5,
        gpus_per_instance=8,
        price_per_hour=1.0,
    )
    assert advice.plan is None
    assert advice.closest.instances == 64 and advice.closest.epoch_minutes > 0.5


@pytest.mark.parametrize("efficiency", [0.5, 0.3, 1.2])
def test_an_efficiency_at_which_gpus_cannot_help_is_refused(efficiency: float) -> None:
    with pytest.raises(ValueError, match="efficiency"):
        scaled_throughput(1.0, 8, efficiency)


# The origin story's measurement, as a person types it: 8 GPUs, half the time waiting on the loader.
ORIGIN_ARGS = [
    *("--throughput", f"{ORIGIN.images_per_sec}", "--efficiency", "0.9", "--dataset-size", str(DATASET)),
    *("--target-epoch-minutes", "6", "--stall-fraction", "0.5"),
]


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(advise_command.command)
    return app


def test_the_command_answers_with_and_without_the_loader_fix() -> None:
    result = CliRunner().invoke(_cli(), ORIGIN_ARGS)
    assert result.exit_code == 0, result.output
    assert "as measured: 15 x ml.p4d.24xlarge (120 GPUs)" in result.output, result.output
    assert "loader fixed (2.00x: no stall): 7 x ml.p4d.24xlarge (56 GPUs)" in result.output
    assert "57.0 min per epoch" in result.output
    assert "aws.amazon.com/sagemaker/pricing" in result.output, "say where prices come from"


def test_a_given_price_overrides_the_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        _cli(),
        [
            "--throughput",
            "100",
            "--efficiency",
            "1",
            "--dataset-size",
            "60000",
            "--target-epoch-minutes",
            "10",
            "--instance-type",
            "ml.p5.48xlarge",
            "--price-per-hour",
            "60",
        ],
    )
    assert result.exit_code == 0, result.output
    # 100 images/s on one instance: 10 min per epoch, 1 instance, 60 $/h for 1/6 h.
    assert "as measured: 1 x ml.p5.48xlarge (8 GPUs) -> 10.00 min per epoch" in result.output
    assert "$10.00 per epoch" in result.output and "given" in result.output


def test_an_unknown_instance_type_needs_its_gpus_and_price() -> None:
    result = CliRunner().invoke(
        _cli(),
        [
            "--throughput",
            "100",
            "--efficiency",
            "0.9",
            "--dataset-size",
            "1000",
            "--target-epoch-minutes",
            "1",
            "--instance-type",
            "ml.x9.huge",
        ],
    )
    assert result.exit_code != 0
    assert "--price-per-hour" in result.output


def test_a_runs_metrics_file_gives_throughput_gpus_stall_and_size(tmp_path: Path) -> None:
    metrics = {
        "dataset_version": "v1",
        "code_sha256": "0" * 64,
        "torch_version": "2.13.0",
        "host": {
            "hostname": "algo-1",
            "platform": "linux",
            "python_version": "3.11",
            "torch_version": "2.13.0",
            "device": "cuda",
            "world_size": 8,
            "backend": "nccl",
        },
        "seed": 0,
        "config": {},
        "classes": ["road"],
        "train_images": DATASET,
        "val_images": 500,
        "epochs": [
            {
                "epoch": number,
                "train_loss": 1.0,
                "lr": 0.01,
                "miou": 0.5,
                "per_class_iou": {"road": 0.5},
                "stall_fraction": stall,
                "images_per_sec": speed,
                "epoch_seconds": 3420.0,
                "steps": 100,
            }
            for number, (stall, speed) in enumerate(
                [(0.7, 10.0), (0.5, ORIGIN.images_per_sec), (0.5, ORIGIN.images_per_sec)],
                start=1,
            )
        ],
    }
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics))
    measurement, images, device = advise_command.from_metrics(path)
    assert images == DATASET and measurement.gpus == 8 and device == "cuda"
    assert measurement.images_per_sec == pytest.approx(ORIGIN.images_per_sec), "median epoch"
    assert measurement.stall_fraction == pytest.approx(0.5)

    result = CliRunner().invoke(
        _cli(),
        ["--from-metrics", str(path), "--efficiency", "0.9", "--target-epoch-minutes", "6"],
    )
    assert result.exit_code == 0, result.output
    assert "loader fixed (2.00x: no stall): 7 x ml.p4d.24xlarge" in result.output


def test_the_command_answers_in_json_with_the_plans_and_both_verdicts() -> None:
    result = CliRunner().invoke(_cli(), [*ORIGIN_ARGS, "--json"])

    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert (answer["instance_type"], answer["gpus_per_instance"], answer["dataset_size"]) == (
        "ml.p4d.24xlarge",
        8,
        DATASET,
    )
    assert answer["price_per_hour"] == P4D.price_per_hour and "aws.amazon.com" in answer["price_source"]
    assert answer["measured_epoch_minutes"] == pytest.approx(57.0)
    assert answer["measurement"]["stall_fraction"] == 0.5
    assert (answer["as_measured"]["plan"]["instances"], answer["as_measured"]["plan"]["gpus"]) == (15, 120)
    assert answer["loader_fixed"]["speedup"] == pytest.approx(2.0)
    assert answer["loader_fixed"]["plan"]["instances"] == 7
    assert [plan["instances"] for plan in answer["plans"]] == [1, 2, 4, 7, 8, 15, 16, 32, 64]


def test_an_unreachable_target_is_a_null_plan_in_json() -> None:
    args = ["--throughput", "1", "--efficiency", "0.9", "--dataset-size", str(DATASET), "--target-epoch-minutes", "1"]

    result = CliRunner().invoke(_cli(), [*args, "--json"])

    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["as_measured"]["plan"] is None and answer["loader_fixed"] is None
    assert answer["as_measured"]["closest"]["instances"] == answer["max_instances"]
