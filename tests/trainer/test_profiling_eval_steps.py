"""Validation passes are profiled as EVAL steps: in the step files, kept out of the rules that
judge training steps, and shown apart in the report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.profiling.report import render_html
from trainer.profiling.rules import ProfileData, evaluate
from trainer.profiling.session import Profiler
from trainer.profiling.steps import StepTimeline, steps_file
from trainer.train import evaluate as validate

T0 = 1764687600.0


class TinySegmenter(nn.Module):
    """The trainer's model contract: a list of logits, the main head first."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.head = nn.Conv2d(3, classes, 1)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        return [self.head(images)]


def test_a_validation_pass_writes_one_eval_step_per_batch(tmp_path: Path) -> None:
    images, labels = torch.randn(10, 3, 8, 16), torch.randint(0, 4, (10, 8, 16))
    loader = DataLoader(TensorDataset(images, labels), batch_size=4)
    profiler = Profiler(tmp_path, interval_ms=100).start()
    confusion = validate(
        TinySegmenter(4),
        loader,
        torch.device("cpu"),
        4,
        amp_dtype=None,
        channels_last=False,
        profiler=profiler,
        epoch=3,
    )
    profiler.finish()
    assert int(confusion.matrix.sum()) == 10 * 8 * 16
    steps = [json.loads(line) for line in steps_file(tmp_path / "profile", 0).read_text().splitlines()]
    assert [(s["phase"], s["epoch"], s["step"]) for s in steps] == [("EVAL", 3, 1), ("EVAL", 3, 2), ("EVAL", 3, 3)]
    for step in steps:
        assert "loss" not in step and step["communication"] == 0.0
        assert step["duration"] > 0 and step["data_wait"] + step["compute"] == pytest.approx(step["duration"], abs=2e-6)
    page = (tmp_path / "report.html").read_text()
    assert "Validation passes" in page and "No training steps recorded" in page


def _steps(profile: Path, *, evaluation: bool) -> None:
    """Two ranks, two epochs of healthy training steps; with `evaluation`, a validation pass
    after each epoch whose batches wait for data 90 % of the time and take 20 times as long."""
    timelines = [StepTimeline(profile, rank, "algo-1") for rank in (0, 1)]
    clock = T0
    for epoch in range(2):
        for step in range(1, 201):
            clock += 0.1
            for timeline in timelines:
                timeline.record(
                    step=epoch * 200 + step,
                    epoch=epoch,
                    start=clock,
                    data_wait=0.002,
                    compute=0.095 + 0.001 * (step % 3),
                    communication=0.003,
                    loss=3.0 - 0.005 * (epoch * 200 + step),
                    phase="TRAIN",
                )
        for batch in range(1, 31 if evaluation else 1):
            clock += 2.0
            for timeline in timelines:
                timeline.record(
                    step=batch,
                    epoch=epoch,
                    start=clock,
                    data_wait=1.8,
                    compute=0.2,
                    communication=0.0,
                    phase="EVAL",
                )
    for timeline in timelines:
        timeline.close()


def _judged(data: ProfileData) -> dict[str, dict[str, Any]]:
    names = ["DataStall", "LossNotDecreasing", "StepOutlier", "MaxInitializationTime"]
    return {result.name: result.to_dict() for result in evaluate(data, names=names)}


def test_eval_steps_are_not_judged_as_training_steps(tmp_path: Path) -> None:
    _steps(tmp_path / "with", evaluation=True)
    _steps(tmp_path / "without", evaluation=False)
    with_eval = _judged(ProfileData.read(tmp_path / "with"))
    without = _judged(ProfileData.read(tmp_path / "without"))
    assert with_eval["DataStall"]["status"] == "NoIssuesFound", "the slow validation loader is no training stall"
    for name in ("DataStall", "LossNotDecreasing", "MaxInitializationTime"):
        assert with_eval[name] == without[name], name
    # StepOutlier judges each phase on its own (as Debugger's mode None): EVAL never raises the
    # TRAIN steps' mean and deviation, and no TRAIN step becomes an outlier because of them.
    groups = (with_eval["StepOutlier"]["evidence"] or {}).get("groups", [])
    assert all(group["phase"] == "EVAL" for group in groups), groups
    assert without["StepOutlier"]["status"] == with_eval["StepOutlier"]["status"] == "NoIssuesFound"


def test_the_report_shows_validation_passes_apart(tmp_path: Path) -> None:
    _steps(tmp_path, evaluation=True)
    data = ProfileData.read(tmp_path)
    page = render_html(data, evaluate(data))
    assert "<b>800</b>training steps (all ranks)" in page, "2 ranks x 2 epochs x 200, no EVAL step"
    assert "<b>120</b>validation steps (all ranks)" in page
    section = page[page.index("Validation passes") :]
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>([\d.]+) s</td>", section)
    assert rows == [("0", "2", "60", "60.00"), ("1", "2", "60", "60.00")], rows
    assert "90.0 %" in section, "their data wait"
    assert "<th>120</th><th>120.00 s</th>" in section, "all passes together"
    ranks = page[page.index("Per-rank load balance") : page.index("Step timelines")]
    assert ranks.count("<td>400</td>") == 2, "each rank's training steps only"
