"""LossNotDecreasing: the training loss of the step lines, checked every `num_steps` steps."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainer.profiling.rules.common import (
    MIN_SAMPLES,
    NOISE_STANDARD_ERRORS,
    STATUS_ISSUES,
    STATUS_OK,
    ProfileData,
    RuleEvaluation,
    _cut,
    _params,
    _scale,
    _scaled_note,
    _too_few,
)


def _relative_noise(losses: Sequence[float]) -> float:
    """The per-step loss's scatter, as a fraction of the loss; a trend and a few odd steps aside.

    From the differences of consecutive steps relative to their loss (a trend moves two
    neighbouring steps little), their median absolute deviation (a few hard batches count little)
    times 1.4826 (a standard deviation, for normal noise), over sqrt(2) (a difference holds the
    noise of two steps).
    """
    values = np.array([value for value in losses if math.isfinite(value)], dtype=float)
    if len(values) < 3:
        return 0.0
    level = (np.abs(values[1:]) + np.abs(values[:-1])) / 2
    keep = level > 0
    if not keep.any():
        return 0.0
    relative = np.diff(values)[keep] / level[keep]
    deviation = float(np.median(np.abs(relative - np.median(relative))))
    return 1.4826 * deviation / math.sqrt(2)


def loss_not_decreasing(data: ProfileData, p: Mapping[str, Any]) -> RuleEvaluation:  # noqa: PLR0912, PLR0915
    """Every `num_steps` steps, the mean loss of the last `window` steps against the previous
    check and the lowest so far (Debugger's semantics; see the package docstring).

    Why `window` may be longer than `num_steps`: Debugger's 10 steps assume a loss whose 10-step
    mean is steady to well within `increase_threshold_percent`, as with large batches. With small
    batches (the offline demo: 4 images a step) one step's loss scatters by about 10 %, a 10-step
    mean by about 3 %, and the lowest of a run's many such means sits a few standard errors below
    the trend: a healthy, falling loss then rises "5 % above the lowest" by chance alone. So the
    window is sized to the run's own noise: as many steps as make the standard error of its mean
    at most a quarter of `increase_threshold_percent` (a real rise of that size is four standard
    errors), and never fewer than `num_steps`. A loss as steady as Debugger assumes keeps
    `num_steps`; a run too short for two checks of such windows is not judged (not applicable).
    The checks stay every `num_steps` steps (a stopping rule reacts as soon as Debugger's would).
    """
    result = RuleEvaluation("LossNotDecreasing", STATUS_OK, parameters=_params(p))
    mode = p.get("mode") or "TRAIN"
    # Per step number, every rank's loss, in file order: a float sum depends on its order.
    per_step: dict[int, list[float]] = defaultdict(list)
    for chosen in data.steps.groups(lambda s: mode, lambda s: s.get("phase", "TRAIN") == mode, by_start=False).values():
        has = chosen.column("has_loss")
        for step, loss in zip(chosen.column("step")[has].tolist(), chosen.column("loss")[has].tolist(), strict=True):
            per_step[int(step)].append(loss)
    if not per_step:
        return result.not_applicable(f"no {mode} losses recorded")
    steps = sorted(per_step)
    losses = [sum(per_step[s]) / len(per_step[s]) for s in steps]
    n = len(losses)
    result.datapoints = n
    if n < MIN_SAMPLES:
        return result.not_applicable(_too_few(f"{mode} losses", n))
    num_steps, _, scaled = _scale(n, int(p["num_steps"]))
    threshold = float(p["increase_threshold_percent"]) / 100
    noise = _relative_noise(losses)
    window = num_steps
    if threshold > 0 and noise > 0:
        window = max(num_steps, math.ceil((NOISE_STANDARD_ERRORS * noise / threshold) ** 2))
    # Debugger's cadence: a check every num_steps steps, the first once a window is full.
    first = math.ceil(window / num_steps) * num_steps
    if n < first + num_steps:
        return result.not_applicable(
            f"only {n} {mode} steps: one step's loss scatters by {100 * noise:.0f} %, so telling a "
            f"rise of {p['increase_threshold_percent']} % from noise takes means over {window} steps, "
            f"compared every {num_steps} steps ({first + num_steps} steps at least)"
        )
    notes = []
    if scaled:
        notes.append(_scaled_note(n, num_steps, None, "num_steps"))
    if window > num_steps:
        notes.append(
            f"one step's loss scatters by {100 * noise:.0f} % (small batches): each check compares "
            f"the mean of the last {window} steps, not {num_steps}, so that a rise of "
            f"{p['increase_threshold_percent']} % is {NOISE_STANDARD_ERRORS} standard errors of it"
        )
    checks = []
    for end in range(first, n + 1, num_steps):
        chunk = losses[end - window : end]
        checks.append((steps[end - 1], sum(chunk) / len(chunk)))
    found: list[dict[str, Any]] = []
    lowest = math.inf
    for index, (at_step, loss) in enumerate(checks):
        if index:
            previous = checks[index - 1][1]
            if not math.isfinite(loss):
                bad = True
            elif loss > previous:
                bad = loss > lowest * (1 + threshold)
            else:
                bad = previous - loss < float(p["diff_percent"]) / 100 * abs(previous)
            if bad:
                found.append({"step": at_step, "loss": loss, "previous": previous, "lowest": lowest})
        lowest = min(lowest, loss)
    result.trigger_count = result.violations = len(found)
    result.detail = "; ".join(notes) or None
    result.evidence = {
        "checks": len(checks),
        "window_steps": window,
        "every_steps": num_steps,
        "step_noise_percent": 100 * noise,
        "first": {"step": checks[0][0], "loss": checks[0][1]},
        "last": {"step": checks[-1][0], "loss": checks[-1][1]},
        "lowest": lowest,
        "violations": _cut(found),
    }
    if found:
        result.status = STATUS_ISSUES
        first_found = found[0]
        if not math.isfinite(first_found["loss"]):
            what = "not a finite number: the training diverged"
        elif first_found["loss"] > first_found["previous"]:
            what = (
                f"above the lowest so far ({first_found['lowest']:.4g}) by more than "
                f"{p['increase_threshold_percent']} %"
            )
        else:
            what = f"down from {first_found['previous']:.4g} by less than {p['diff_percent']} % in {num_steps} steps"
        result.recommendation = (
            f"The training loss stopped going down: at step {first_found['step']} its mean over the "
            f"last {window} steps was {first_found['loss']:.4g}, {what}. Lower the learning rate, "
            "check the labels of newly added data, or stop early."
        )
    return result
