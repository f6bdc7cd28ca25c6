"""The trainer's profiling flags, and the environment the job request sets for them."""

from __future__ import annotations

import pytest

from trainer.train import get_args_parser


def test_profiling_is_on_by_default_at_500_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RETRAIN_PROFILING", raising=False)
    monkeypatch.delenv("RETRAIN_PROFILING_INTERVAL_MS", raising=False)
    args = get_args_parser().parse_args([])
    assert (args.profiling, args.profiling_interval_ms) == ("builtin", 500)
    assert args.stop_on_rule == "" and args.rules_every_seconds == 0.0


def test_the_job_requests_environment_sets_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRAIN_PROFILING_INTERVAL_MS", "1000")
    monkeypatch.setenv("RETRAIN_PROFILING", "debugger")
    args = get_args_parser().parse_args([])
    assert args.profiling == "off", "with Debugger profiling the job, the trainer stays out"
    assert args.profiling_interval_ms == 1000


def test_an_interval_sagemaker_would_refuse_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--profiling-interval-ms", "300"])
    assert "invalid choice" in capsys.readouterr().err
