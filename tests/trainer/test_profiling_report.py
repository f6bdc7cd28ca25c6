"""rules.json is the functions' contract; report.html stands alone, offline."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path

from functions.common.rules import parse_rules_file
from trainer.profiling import rerender
from trainer.profiling.monitor import SystemMonitor
from trainer.profiling.report import render_html, write_outputs
from trainer.profiling.rules import ProfileData, evaluate
from trainer.profiling.steps import StepTimeline

from .test_profiling_rules import starved_run


def real_profile(profile_dir: Path) -> ProfileData:
    """What the trainer's pieces really write: a sampler and two ranks' step files."""
    with SystemMonitor(profile_dir, node="algo-1", interval_ms=100, gpus=False):
        started = time.time()
        timelines = [StepTimeline(profile_dir, rank, "algo-1") for rank in (0, 1)]
        for step in range(1, 31):
            for rank, timeline in enumerate(timelines):
                wait = 0.05 if rank == 0 else 0.004
                timeline.record(
                    step=step,
                    epoch=0,
                    start=started + step * 0.01,
                    data_wait=wait,
                    compute=0.008,
                    communication=0.001,
                    loss=3.0 - step * 0.05,
                )
        time.sleep(0.35)
        for timeline in timelines:
            timeline.close()
    return ProfileData.read(profile_dir, loader={"workers": 0, "decoder": "pillow"})


def test_real_trainer_output_is_a_valid_rules_file(tmp_path: Path) -> None:
    data = real_profile(tmp_path / "profile")
    assert data.system and len(data.steps) == 60
    results = evaluate(data)
    rules_path, report_path = write_outputs(tmp_path, data, results, job_name="retrain-v1-abc")
    parsed = parse_rules_file(rules_path.read_text())
    assert parsed.backend == "builtin" and parsed.job_name == "retrain-v1-abc"
    assert {rule.source for rule in parsed.rules} == {"builtin"}
    assert [rule.name for rule in parsed.rules] == [r.name for r in results]
    stall = next(rule for rule in parsed.rules if rule.name == "DataStall")
    assert stall.status == "IssuesFound", "rank 0 waited 85 % of each step"
    assert stall.recommendation.startswith("The model waited for data")
    assert report_path.read_text().startswith("<!doctype html>")


def test_the_report_is_self_contained_and_shows_what_an_engineer_needs(tmp_path: Path) -> None:
    cores = [
        {
            "Type": "cpu",
            "Name": f"cpu{c}",
            "Dimension": "CPUUtilization",
            "Value": 10.0 * c,
            "NodeId": "algo-1",
            "Timestamp": 1000.0 + i * 0.5,
        }
        for i in range(200)
        for c in range(4)
    ]
    data = starved_run(more_system=cores)
    metrics = {
        "dataset_version": "v7",
        "code_sha256": "ab" * 32,
        "epochs": [{"epoch": e, "train_loss": 3.0 / (e + 1), "miou": 0.1 * e} for e in range(5)],
    }
    page = render_html(data, evaluate(data), job_name="retrain-v7", metrics=metrics)
    assert "<script" not in page.lower(), "no scripts: it must open anywhere, offline"
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page), "nothing loaded remotely"
    assert "<link" not in page.lower()
    for needed in (
        "DataStall",
        "IssuesFound",
        "waited for data 46 %",
        "CPU utilization",
        "GPU utilization",
        "table class='heat'",
        "<svg",
        "rank 0",
        "data wait",
        "validation mIoU",
        "v7",
    ):
        assert needed in page, f"the report lacks {needed!r}"
    # Issues first: the engineer sees what is wrong before what is fine.
    assert page.index("IssuesFound") < page.index("NoIssuesFound")
    checker = _Balance()
    checker.feed(page)
    assert checker.open == [], f"unclosed tags: {checker.open}"


def test_a_cpu_only_run_says_there_are_no_gpu_metrics(tmp_path: Path) -> None:
    page = render_html(ProfileData(), evaluate(ProfileData()))
    assert "No GPU metrics on this run" in page
    assert "No training steps recorded" in page


def _rule_row(page: str, name: str) -> str:
    start = page.index(f"<tr><td><b>{name}</b>")
    return page[start : page.index("</tr>", start)]


def test_on_a_cpu_host_the_gpu_rules_are_not_applicable_not_passed(tmp_path: Path) -> None:
    data = real_profile(tmp_path / "profile")  # sampled with gpus=False: a CPU host
    results = evaluate(data)
    rules_path, report_path = write_outputs(tmp_path, data, results)
    parsed = {rule.name: rule for rule in parse_rules_file(rules_path.read_text()).rules}
    page = report_path.read_text()
    for name in ("LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "BatchSize", "GPUMemoryIncrease"):
        assert parsed[name].status == "NoIssuesFound" and not parsed[name].applicable, parsed[name]
        row = _rule_row(page, name)
        assert "badge NotApplicable" in row and "badge NoIssuesFound" not in row, row
        assert "not applicable on this host: no GPU metrics on this run" in row, row
    assert "not applicable on this host" in _rule_row(page, "LoadBalancing")
    judged = sum(rule.applicable for rule in parsed.values())
    issues = sum(rule.status == "IssuesFound" for rule in parsed.values())
    assert f"<b>{issues} of {judged} that could judge</b>rules with issues" in page
    assert f"<b>{len(parsed) - judged}</b>rules not applicable on this host" in page
    # Not applicable comes last: after the rules that judged and passed.
    assert page.index("badge NotApplicable") > page.rindex("badge NoIssuesFound")


def test_recorded_verdicts_keep_applicability_and_older_files_still_render(tmp_path: Path) -> None:
    reason = "no GPU metrics on this run (a CPU host, or no NVML/nvidia-smi)"
    document = {
        "rules": [
            {"name": "LoadBalancing", "status": "NoIssuesFound", "applicable": False, "not_applicable_reason": reason},
            {"name": "StepOutlier", "status": "NoIssuesFound"},  # written before the field
        ]
    }
    balancing, outlier = rerender.recorded_results(document, tmp_path / "rules.json")
    assert not balancing.applicable and balancing.not_applicable_reason == reason
    assert outlier.applicable and outlier.not_applicable_reason is None
    page = render_html(ProfileData(), [balancing, outlier])
    assert f"not applicable on this host: {reason}" in _rule_row(page, "LoadBalancing")
    assert "badge NoIssuesFound" in _rule_row(page, "StepOutlier")


class _Balance(HTMLParser):
    """Counts unclosed tags (void elements excepted): a broken table ruins a report."""

    VOID = frozenset({"meta", "br", "rect", "polyline", "input", "img", "hr"})

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-3:]}"
        self.open.pop()


def test_the_report_can_be_re_rendered_from_a_runs_output_folder(tmp_path: Path) -> None:
    real_profile(tmp_path / "profile")
    (tmp_path / "metrics.json").write_text(
        json.dumps({"dataset_version": "v9", "epochs": [{"epoch": 0, "train_loss": 2.0, "miou": 0.2}]})
    )
    assert rerender.main([str(tmp_path), "--job-name", "again"]) == 0
    assert parse_rules_file((tmp_path / "rules.json").read_text()).job_name == "again"
    page = (tmp_path / "report.html").read_text()
    checker = _Balance()
    checker.feed(page)
    assert checker.open == [], f"unclosed tags: {checker.open}"
    assert "v9" in page
