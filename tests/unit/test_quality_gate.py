"""The quality gate: which models replace the accepted one, and the reasons a team is given."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from functions.common.contracts import MetricsFile
from functions.common.models import AcceptedModel
from functions.evaluate_run.gate import GatePolicy, judge

POLICY = GatePolicy(miou_tolerance=0.01, class_tolerance=0.05)


def metrics(
    miou: float,
    classes: dict[str, float | None],
    *,
    baseline: Any = None,
    losses: tuple[float, ...] = (1.0, 0.5),
    evaluation: Any = None,
) -> MetricsFile:
    return MetricsFile.model_validate(
        {
            "dataset_version": "ds-1",
            "code_sha256": "0" * 64,
            "torch_version": "2.13.0",
            "host": {
                "hostname": "h",
                "platform": "p",
                "python_version": "3.11",
                "torch_version": "2.13.0",
                "device": "cpu",
                "world_size": 1,
                "backend": "gloo",
            },
            "seed": 0,
            "config": {},
            "classes": list(classes),
            "train_images": 10,
            "val_images": 2,
            "epochs": [
                {
                    "epoch": i + 1,
                    "train_loss": loss,
                    "lr": 0.1,
                    "miou": miou,
                    "per_class_iou": classes,
                    "stall_fraction": 0.0,
                    "images_per_sec": 1.0,
                    "epoch_seconds": 1.0,
                    "steps": 1,
                }
                for i, loss in enumerate(losses)
            ],
            "miou": miou,
            "per_class_iou": classes,
            "baseline": baseline,
            "evaluation": evaluation,
            "complete": True,
        }
    )


def accepted_before(miou: float, classes: dict[str, float | None]) -> AcceptedModel:
    return AcceptedModel(
        run="run-1",
        job_name="j",
        dataset_version="ds-0",
        model_uri="s3://b/m.tar.gz",
        weights_prefix_uri="s3://b/models/runs/run-1/",
        miou=miou,
        per_class_iou=classes,
        accepted_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


def test_the_first_model_is_accepted_when_it_learned() -> None:
    verdict = judge(metrics(0.41, {"road": 0.8, "car": 0.02}), POLICY)

    assert verdict.accepted
    assert "the first model" in verdict.reasons[0]


def test_a_first_model_that_learned_nothing_is_rejected() -> None:
    verdict = judge(metrics(0.0, {"road": 0.0}, losses=(1.0, 1.2)), POLICY)

    assert not verdict.accepted
    assert any("learned nothing" in reason for reason in verdict.reasons)
    assert any("did not fall" in reason for reason in verdict.reasons)


def test_a_better_model_replaces_the_accepted_one_scored_on_the_same_split() -> None:
    baseline = {"model": "model.pt", "miou": 0.50, "per_class_iou": {"road": 0.9, "car": 0.1}}

    verdict = judge(metrics(0.55, {"road": 0.92, "car": 0.18}, baseline=baseline), POLICY)

    assert verdict.accepted
    assert verdict.miou_change == 0.05
    assert verdict.worse_classes == {}
    assert verdict.reasons == [
        "mIoU 0.550, up 0.050 on the accepted model's 0.500 (both scored on this run's validation split, "
        "as no pair is trusted yet); no class fell by more than 0.050"
    ]


def test_a_model_worse_beyond_tolerance_is_rejected_with_the_numbers() -> None:
    baseline = {"model": "model.pt", "miou": 0.50, "per_class_iou": {"road": 0.9, "car": 0.1}}

    verdict = judge(metrics(0.47, {"road": 0.9, "car": 0.04}, baseline=baseline), POLICY)

    assert not verdict.accepted
    assert verdict.worse_classes == {"car": -0.06}
    split = "(both scored on this run's validation split, as no pair is trusted yet)"
    assert verdict.reasons == [
        f"mIoU fell to 0.470 from the accepted model's 0.500, by 0.030: more than the 0.010 allowed {split}",
        f"car IoU fell by 0.060: more than the 0.050 allowed {split}",
    ]


def test_one_class_falling_too_far_rejects_even_a_better_mean() -> None:
    baseline = {"model": "model.pt", "miou": 0.50, "per_class_iou": {"road": 0.5, "person": 0.5}}

    verdict = judge(metrics(0.55, {"road": 0.8, "person": 0.3}, baseline=baseline), POLICY)

    assert not verdict.accepted
    assert verdict.reasons == [
        "person IoU fell by 0.200: more than the 0.050 allowed "
        "(both scored on this run's validation split, as no pair is trusted yet)"
    ]


def test_without_a_fresh_score_the_recorded_one_is_used_and_said_so() -> None:
    verdict = judge(metrics(0.52, {"road": 0.9}), POLICY, accepted_before(0.50, {"road": 0.9}))

    assert verdict.accepted
    assert verdict.baseline_miou == 0.50
    assert "earlier validation split" in verdict.reasons[0]


def test_a_version_without_validation_images_cannot_be_judged() -> None:
    empty = metrics(0.5, {"road": 0.5}).model_copy(update={"val_images": 0})

    verdict = judge(empty, POLICY)

    assert not verdict.accepted
    assert "no validation images" in verdict.reasons[0]


def test_a_slightly_worse_model_within_tolerance_is_told_plainly() -> None:
    baseline = {"model": "model.pt", "miou": 0.50, "per_class_iou": {"road": 0.9}}

    verdict = judge(metrics(0.495, {"road": 0.9}, baseline=baseline), POLICY)

    assert verdict.accepted
    assert verdict.reasons[0].startswith(
        "mIoU 0.495, down 0.005, within the 0.010 allowed, from the accepted model's 0.500"
    )


def _scores(miou: float, classes: dict[str, float]) -> dict[str, Any]:
    return {"miou": miou, "per_class_iou": classes}


def test_the_gate_judges_on_trusted_pairs_not_on_a_split_a_bad_batch_moved() -> None:
    """The poisoned-drop story: on the whole split (which holds a mislabelled batch's pairs) the
    candidate trained on those labels looks better; on trusted pairs it lost road."""
    baseline = {"model": "model.pt", "miou": 0.287, "per_class_iou": {"road": 0.5, "sky": 0.2}}
    evaluation = {
        "batches": {},
        "trusted": {
            "batches": ["team-a", "benchmark-1"],
            "pairs": 40,
            "candidate": _scores(0.30, {"road": 0.40, "sky": 0.20}),
            "accepted": _scores(0.33, {"road": 0.50, "sky": 0.16}),
        },
    }

    verdict = judge(metrics(0.372, {"road": 0.6, "sky": 0.3}, baseline=baseline, evaluation=evaluation), POLICY)

    assert not verdict.accepted
    assert verdict.miou == 0.30 and verdict.baseline_miou == 0.33
    assert verdict.compared_on == "both scored on 40 trusted validation pairs of 2 batches"
    assert verdict.worse_classes == {"road": -0.1}
    assert verdict.reasons[0].startswith("mIoU fell to 0.300 from the accepted model's 0.330, by 0.030")


def test_with_no_trusted_validation_pair_the_gate_falls_back_to_the_split_and_says_so() -> None:
    baseline = {"model": "model.pt", "miou": 0.50, "per_class_iou": {"road": 0.9}}
    evaluation = {"batches": {}, "trusted": {"batches": [], "pairs": 0}}

    verdict = judge(metrics(0.55, {"road": 0.92}, baseline=baseline, evaluation=evaluation), POLICY)

    assert verdict.accepted and verdict.compared_on is not None
    assert "as no pair is trusted yet" in verdict.compared_on
