"""The GPU benchmark refuses, clearly and before any work, on a machine without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_benchmark.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_benchmark"] = module
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_prints_no_numbers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    benchmark = _load()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        benchmark.main([])
    assert stopped.value.code == benchmark.EXIT_NO_GPU != 0
    captured = capsys.readouterr()
    assert captured.out == "", "no `name: value` line may suggest a result"
    assert "needs a CUDA GPU" in captured.err and "make bench" in captured.err


def test_it_is_not_picked_up_by_make_bench() -> None:
    # `make bench` runs benchmarks/bench_*.py on CPU-only machines.
    assert not SCRIPT.name.startswith("bench_")
