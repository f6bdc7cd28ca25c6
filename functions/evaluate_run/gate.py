"""The quality gate: is the new model good enough to replace the accepted one?

A model is accepted when its mIoU is not below the accepted model's by more than
`miou_tolerance` and no class's IoU falls by more than `class_tolerance`; otherwise the run ends
`rejected` (a successful run with a clear verdict). Both models are scored by the same job on
the *trusted set* (`metrics.json`'s `evaluation.trusted`): the validation pairs of batches whose
labels earned trust and the team's benchmark batches, never only a split that moves with new
data, where a mislabelled batch's pairs would make a model trained on its labels look better.
Without a trusted set (a job from before screening, or a version whose trusted batches hold no
validation pair) the comparison falls back to the run's whole validation split, and says so.
The first run is accepted if it learned anything at all: a validation mIoU above
`first_run_min_miou` and, over two or more epochs, a training loss that fell. A run whose
screening found a dispute (a batch that contradicts a provisional model wholesale, with no
independent labels to say which side is right) is not accepted: it trained on both sides.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from functions.common.contracts import MetricsFile
from functions.common.models import AcceptedModel
from functions.common.summary import GateVerdict


class GatePolicy(BaseModel):
    miou_tolerance: float = Field(default=0.01, ge=0.0, le=1.0)
    class_tolerance: float = Field(default=0.05, ge=0.0, le=1.0)
    first_run_min_miou: float = Field(default=0.0, ge=0.0, lt=1.0)


def judge(metrics: MetricsFile, policy: GatePolicy, accepted: AcceptedModel | None = None) -> GateVerdict:
    verdict = GateVerdict(
        accepted=False,
        reasons=[],
        miou=metrics.miou,
        miou_tolerance=policy.miou_tolerance,
        class_tolerance=policy.class_tolerance,
    )
    if metrics.miou is None or metrics.val_images == 0:
        return verdict.model_copy(
            update={"reasons": ["the dataset version has no validation images: nothing to judge by"]}
        )
    disputed = metrics.screening.disputed if metrics.screening is not None else []
    if disputed:
        return verdict.model_copy(
            update={
                "reasons": [
                    f"trained on both sides of a dispute ({', '.join(disputed)} against the model's own data): "
                    "a model of two contradicting label sets is neither's; decide which is right first"
                ]
            }
        )
    trusted = metrics.evaluation.trusted if metrics.evaluation is not None else None
    if trusted is not None and trusted.pairs and trusted.candidate and trusted.accepted:
        miou, classes = trusted.candidate.miou, trusted.candidate.per_class_iou
        baseline_miou, baseline_classes = trusted.accepted.miou, trusted.accepted.per_class_iou
        batches = f"{len(trusted.batches)} batch{'' if len(trusted.batches) == 1 else 'es'}"
        where = f"both scored on {trusted.pairs} trusted validation pairs of {batches}"
        verdict = verdict.model_copy(update={"trusted_pairs": trusted.pairs})
    elif metrics.baseline is not None:
        miou, classes = metrics.miou, metrics.per_class_iou
        baseline_miou, baseline_classes = metrics.baseline.miou, metrics.baseline.per_class_iou
        where = "both scored on this run's validation split, as no pair is trusted yet"
    elif accepted is not None:
        miou, classes = metrics.miou, metrics.per_class_iou
        baseline_miou, baseline_classes = accepted.miou, accepted.per_class_iou
        where = "the accepted model as recorded when it was accepted, on an earlier validation split"
    else:
        return _first_run(metrics, policy, verdict)
    change = miou - baseline_miou
    worse = {
        name: round(new - old, 4)
        for name, old in baseline_classes.items()
        if old is not None and (new := classes.get(name)) is not None and new < old
    }
    problems = []
    if change < -policy.miou_tolerance:
        problems.append(
            f"mIoU fell to {miou:.3f} from the accepted model's {baseline_miou:.3f}, by {-change:.3f}: "
            f"more than the {policy.miou_tolerance:.3f} allowed ({where})"
        )
    for name, delta in sorted(worse.items(), key=lambda item: item[1]):
        if -delta > policy.class_tolerance:
            problems.append(
                f"{name} IoU fell by {-delta:.3f}: more than the {policy.class_tolerance:.3f} allowed ({where})"
            )
    direction = (
        f"up {change:.3f} on"
        if change >= 0
        else f"down {-change:.3f}, within the {policy.miou_tolerance:.3f} allowed, from"
    )
    ok = (
        f"mIoU {miou:.3f}, {direction} the accepted model's {baseline_miou:.3f} ({where}); "
        f"no class fell by more than {policy.class_tolerance:.3f}"
    )
    return verdict.model_copy(
        update={
            "accepted": not problems,
            "reasons": problems or [ok],
            "miou": miou,
            "baseline_miou": baseline_miou,
            "miou_change": round(change, 4),
            "worse_classes": worse,
            "compared_on": where,
        }
    )


def _first_run(metrics: MetricsFile, policy: GatePolicy, verdict: GateVerdict) -> GateVerdict:
    assert metrics.miou is not None
    losses = [epoch.train_loss for epoch in metrics.epochs]
    reasons = []
    if metrics.miou <= policy.first_run_min_miou:
        reasons.append(f"mIoU {metrics.miou:.3f} is not above {policy.first_run_min_miou:.3f}: it learned nothing")
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        reasons.append(f"the training loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})")
    accepted = not reasons
    if accepted:
        reasons.append(f"the first model: mIoU {metrics.miou:.3f}, and it learned (no model to compare with yet)")
    return verdict.model_copy(update={"accepted": accepted, "reasons": reasons})
