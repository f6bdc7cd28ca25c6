"""The learning rate warms up linearly, then decays polynomially (power 0.9) to zero."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer.schedule import WarmupPoly, default_warmup


def test_warm_up_climbs_linearly_from_a_tenth_to_the_full_rate() -> None:
    schedule = WarmupPoly(total_steps=100, warmup_steps=10)
    assert schedule(0) == pytest.approx(0.1)
    assert schedule(5) == pytest.approx(0.55)
    assert schedule(10) == pytest.approx(1.0), "warm-up must end at the full rate"


def test_after_warm_up_the_rate_follows_the_poly_curve_down_to_zero() -> None:
    schedule = WarmupPoly(total_steps=110, warmup_steps=10, power=0.9)
    assert schedule(60) == pytest.approx(0.5**0.9), "half-way through decay: (1 - 0.5) ** 0.9"
    assert schedule(110) == 0.0
    values = [schedule(step) for step in range(10, 111)]
    assert all(a > b for a, b in itertools.pairwise(values)), "poly must fall"


def test_without_warm_up_the_first_step_runs_at_the_full_rate() -> None:
    assert WarmupPoly(total_steps=50, warmup_steps=0)(0) == 1.0


def test_the_scheduler_drives_the_optimizer_through_the_curve() -> None:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupPoly(20, 4))
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(0.02) and max(rates) == pytest.approx(0.2)
    assert optimizer.param_groups[0]["lr"] == 0.0, "the run must end at a rate of zero"


def test_default_warm_up_is_five_percent_capped_at_a_thousand_steps() -> None:
    assert default_warmup(400) == 20
    assert default_warmup(1_000_000) == 1000


@pytest.mark.parametrize(("total", "warmup"), [(0, 0), (10, 10), (10, -1)])
def test_an_impossible_schedule_is_refused(total: int, warmup: int) -> None:
    with pytest.raises(ValueError, match="steps"):
        WarmupPoly(total_steps=total, warmup_steps=warmup)
