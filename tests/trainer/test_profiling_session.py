"""The profiler in the training loop: rules while training, a stop all ranks obey, one report."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from functions.common.rules import parse_rules_file
from trainer.profiling import session
from trainer.profiling.rules import RuleEvaluation
from trainer.profiling.session import Profiler


def rising_loss_steps(profiler: Profiler, count: int, epoch: int = 0) -> None:
    now = time.time()
    for step in range(1, count + 1):
        profiler.step(
            step=step,
            epoch=epoch,
            start=now + step * 0.01,
            data_wait=0.001,
            compute=0.009,
            communication=0.0,
            loss=1.0 + 0.1 * step,
        )


def first_stop(profiler: Profiler, seconds: float = 10.0) -> str | None:
    """should_stop() after each of the steps that come until the background thread's verdict."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reason = profiler.should_stop()
        if reason:
            return reason
        time.sleep(0.005)
    return None


def test_a_stopping_rule_stops_the_run_and_the_results_say_which(tmp_path: Path) -> None:
    profiler = Profiler(tmp_path, interval_ms=100, rules_every_seconds=0.0001, stop_on=["LossNotDecreasing"]).start()
    rising_loss_steps(profiler, 60)
    assert first_stop(profiler) == "LossNotDecreasing", [(r.name, r.status, r.detail) for r in profiler.last_results]
    page = profiler.finish(job_name="job-1", metrics={"epochs": [], "stopped_by_rule": "x"})
    assert page is not None and page.exists()
    parsed = parse_rules_file((tmp_path / "rules.json").read_text())
    loss = next(rule for rule in parsed.rules if rule.name == "LossNotDecreasing")
    assert loss.status == "IssuesFound" and loss.evidence.get("stopped_training") is True
    assert loss.detail and "stopped the training" in loss.detail
    assert (tmp_path / "profile" / "steps" / "rank0.jsonl").exists()
    assert list((tmp_path / "profile" / "system").glob("*.jsonl")), "the host sampler wrote"


def test_profiling_off_writes_nothing(tmp_path: Path) -> None:
    profiler = Profiler(tmp_path, mode="off", stop_on=["LossNotDecreasing"]).start()
    rising_loss_steps(profiler, 20)
    assert profiler.should_stop() is None
    assert profiler.finish() is None
    assert not any(tmp_path.iterdir())


def test_misspelt_settings_are_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="LossNotDecresing"):
        Profiler(tmp_path, stop_on=["LossNotDecresing"])
    with pytest.raises(ValueError, match="300 ms"):
        Profiler(tmp_path, interval_ms=300)
    with pytest.raises(ValueError, match="treshold"):
        Profiler(tmp_path, overrides={"DataStall": {"treshold": 0.3}})
    with pytest.raises(ValueError, match="debugger"):
        Profiler(tmp_path, mode="debugger")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _two_hosts(rank: int, port: int, root: str) -> None:
    # Two emulated hosts, each with its own output folder, as on SageMaker.
    os.environ["SM_CURRENT_HOST"] = f"algo-{rank + 1}"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out = Path(root) / f"host{rank + 1}"
        profiler = Profiler(
            out,
            interval_ms=100,
            rank=rank,
            local_rank=0,
            world_size=2,
            rules_every_seconds=0.0001,
            stop_on=["LossNotDecreasing"],
        ).start()
        stopped_at = None
        now = time.time()
        for step in range(1, 5000):
            time.sleep(0.002)  # a step takes time: the background evaluations catch up
            loss = 1.0 + (0.1 * step if rank == 0 else 0.0)  # rank 0 alone sees the rise
            profiler.step(
                step=step,
                epoch=0,
                start=now + step * 0.01,
                data_wait=0.001,
                compute=0.009,
                communication=0.0,
                loss=loss,
            )
            if profiler.should_stop():
                stopped_at = step
                break
        (out / f"stopped-{rank}.json").parent.mkdir(parents=True, exist_ok=True)
        (out / f"stopped-{rank}.json").write_text(json.dumps([stopped_at, profiler.stopped_by]))
        profiler.finish(job_name="two-hosts")
    finally:
        dist.destroy_process_group()


def test_rank_0_stops_every_rank_and_gathers_the_other_hosts_files(tmp_path: Path) -> None:
    # Forked, as in test_timing.py: no second import of torch.
    context = mp.get_context("fork")
    port = _free_port()
    ranks = [context.Process(target=_two_hosts, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a rank failed ({process.exitcode})"
    first = json.loads((tmp_path / "host1" / "stopped-0.json").read_text())
    second = json.loads((tmp_path / "host2" / "stopped-1.json").read_text())
    assert first == second and first[1] == "LossNotDecreasing", (first, second)
    report_dir = tmp_path / "host1"
    assert (report_dir / "profile" / "steps" / "rank1.jsonl").exists(), "rank 1's steps travelled"
    assert (report_dir / "profile" / "system" / "algo-2.jsonl").exists(), "host 2's samples did"
    parsed = parse_rules_file((report_dir / "rules.json").read_text())
    assert parsed.job_name == "two-hosts"
    assert not (tmp_path / "host2" / "rules.json").exists(), "rank 0 alone writes the results"


def _fake_results(name: str = "DataStall", status: str = "IssuesFound") -> list[RuleEvaluation]:
    return [RuleEvaluation(name, status, recommendation="fake")]


def test_a_slow_evaluation_never_holds_up_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_evaluate(data: Any, overrides: Any = None) -> list[RuleEvaluation]:
        entered.set()
        assert release.wait(20), "the test never let the evaluation finish"
        return _fake_results()

    monkeypatch.setattr(session.rules, "evaluate", slow_evaluate)
    profiler = Profiler(tmp_path, interval_ms=100, rules_every_seconds=0.01, stop_on=["DataStall"]).start()
    try:
        assert entered.wait(10), "the background thread evaluates"
        slowest = 0.0
        for step in range(1, 101):  # 100 steps while the evaluation is stuck
            began = time.perf_counter()
            profiler.step(step=step, epoch=0, start=time.time(), data_wait=0.5, compute=0.5, communication=0.0)
            assert profiler.should_stop() is None, "no verdict before the evaluation finishes"
            slowest = max(slowest, time.perf_counter() - began)
        assert slowest < 0.05, f"a step waited {slowest:.3f} s for the rules"
        assert threading.current_thread() is threading.main_thread()
        release.set()
        assert first_stop(profiler) == "DataStall", "the finished verdict reaches the next step"
        assert profiler.should_stop() == "DataStall", "and stays"
    finally:
        release.set()
        profiler.finish()
    assert not [t for t in threading.enumerate() if t.name == "profiler-rules"], "finish() joined the thread"
    assert json.loads((tmp_path / "rules.json").read_text())["rules"][0]["name"] == "DataStall"


def test_the_threads_stop_when_the_training_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), Profiler(tmp_path, interval_ms=100, rules_every_seconds=0.01):
        time.sleep(0.05)
        raise RuntimeError("boom")
    alive = [t.name for t in threading.enumerate() if t.name in ("profiler-rules", "system-monitor")]
    assert alive == [], alive


def test_a_failing_evaluation_is_logged_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def broken(data: Any, overrides: Any = None) -> list[RuleEvaluation]:
        calls.append(1)
        raise OSError("disk full")

    monkeypatch.setattr(session.rules, "evaluate", broken)
    profiler = Profiler(tmp_path, interval_ms=100, rules_every_seconds=0.005, stop_on=["DataStall"]).start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        assert profiler.should_stop() is None
        time.sleep(0.005)
    profiler.close()
    assert len(calls) >= 3, "the thread kept evaluating after a failure"
    assert "periodic rule evaluation failed" in caplog.text


def test_each_evaluation_reads_only_what_was_appended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def counting(data: Any, overrides: Any = None) -> list[RuleEvaluation]:
        seen.append(len(data.steps))
        return _fake_results("DataStall", "NoIssuesFound")

    monkeypatch.setattr(session.rules, "evaluate", counting)
    profiler = Profiler(tmp_path, interval_ms=100).start()  # no thread: evaluations on demand
    rising_loss_steps(profiler, 30)
    profiler.evaluate_now()
    held = profiler._store
    assert held is not None
    offsets = {path.name: tail.offset for path, tail in held._tails.items()}
    rising_loss_steps(profiler, 20, epoch=1)
    profiler.evaluate_now()
    assert seen == [30, 50]
    step_tail = next(tail for path, tail in held._tails.items() if path.name == "rank0.jsonl")
    assert step_tail.offset > offsets["rank0.jsonl"], "read on from where the last evaluation stopped"
    profiler.finish()
    assert seen[-1] == 50
