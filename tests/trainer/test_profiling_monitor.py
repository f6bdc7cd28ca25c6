"""The host sampler writes Debugger's records while the job runs, cheaply; ranks write steps."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retrain.synth import write_scenes
from trainer.data import Augment, SegmentationDataset, read_manifest
from trainer.loader import make_loader
from trainer.profiling import monitor
from trainer.profiling.jsonl import JsonlTail
from trainer.profiling.monitor import SystemMonitor, check_interval, parse_nvidia_smi
from trainer.profiling.steps import StepTimeline

DEBUGGER_KEYS = {"Type", "Name", "Dimension", "Value", "NodeId", "Timestamp"}


def test_only_sagemakers_sampling_intervals_are_accepted() -> None:
    for allowed in (100, 200, 500, 1000, 5000, 60000):
        assert check_interval(allowed) == allowed
    with pytest.raises(ValueError, match="300 ms is not one of 100, 200, 500"):
        SystemMonitor(Path("unused"), interval_ms=300)


def test_the_file_is_readable_while_the_sampler_runs(tmp_path: Path) -> None:
    sampler = SystemMonitor(tmp_path / "profile", node="algo-1", interval_ms=100, gpus=False)
    with sampler:
        time.sleep(0.55)
        # Still running: whatever was sampled so far is already on disk, line by line.
        records = [record for batch in JsonlTail(sampler.path).read() for record in batch]
    assert sampler.path == tmp_path / "profile" / "system" / "algo-1.jsonl"
    assert records, "nothing was flushed while the sampler ran"
    for record in records:
        assert set(record) == DEBUGGER_KEYS, f"not Debugger's record shape: {record}"
        assert record["NodeId"] == "algo-1"
    dimensions = {r["Dimension"] for r in records}
    assert {"CPUUtilization", "I/OWaitPercentage", "MemoryUtilization"} <= dimensions, dimensions
    cores = {r["Name"] for r in records if r["Dimension"] == "CPUUtilization"}
    assert cores == {f"cpu{i}" for i in range(len(cores))} and len(cores) >= 1
    first = records[0]["Timestamp"]
    snapshot = [r for r in records if r["Timestamp"] == first]
    assert len(snapshot) > len(cores), "one sample's records share one timestamp (a snapshot)"
    assert all(0.0 <= r["Value"] <= 100.0 for r in records if r["Dimension"] == "CPUUtilization")


def test_sampling_every_100_ms_costs_under_5_percent_of_a_core(tmp_path: Path) -> None:
    sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=100, gpus=False)
    started = time.perf_counter()
    with sampler:
        time.sleep(2.0)
    wall = time.perf_counter() - started
    assert sampler.samples >= 10, f"only {sampler.samples} samples in {wall:.1f} s"
    share = sampler.cpu_seconds / wall
    assert share < 0.05, f"the sampler used {100 * share:.1f} % of a core at 100 ms"


def test_data_loader_workers_are_the_training_processes_children(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=500, pids=[os.getpid()], gpus=False)
        sampler.start()
        try:
            sampler.sample()
            records = sampler.sample()
        finally:
            sampler.stop()
    finally:
        child.kill()
        child.wait()
    counts = [r["Value"] for r in records if r["Dimension"] == "DataLoaderWorkers"]
    assert counts and counts[0] >= 1, f"the child process was not counted: {records}"
    training = [r["Value"] for r in records if r["Dimension"] == "TrainingProcesses"]
    assert training == [1], "this process is the one training process here"


def test_loader_workers_are_counted_and_the_fork_server_they_start_from_is_not(tmp_path: Path) -> None:
    write_scenes(tmp_path / "scenes", count=8, size=(64, 32), seed=3)
    entries = read_manifest(next((tmp_path / "scenes" / "manifests").glob("*.jsonl")))
    dataset = SegmentationDataset(tmp_path / "scenes", entries, Augment(crop=(48, 24)))
    gc.collect()  # earlier tests' loaders, and their workers, gone
    loader = make_loader(dataset, batch_size=2, sampler=[(i, i) for i in range(8)], workers=2, pin_memory=False)
    batches = iter(loader)
    next(batches)  # the workers, the fork server and multiprocessing's resource tracker run now
    sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=500, pids=[os.getpid()], gpus=False)
    sampler.start()
    try:
        sampler.sample()
        records = sampler.sample()
    finally:
        sampler.stop()
        del batches
    counts = [r["Value"] for r in records if r["Dimension"] == "DataLoaderWorkers"]
    assert counts == [2], f"the loader has 2 workers: {records}"


def test_without_psutil_cpu_and_memory_come_from_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc here")
    monkeypatch.setattr(monitor, "psutil", None)
    sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=500, gpus=False)
    sampler.start()
    try:
        time.sleep(0.05)
        records = sampler.sample()
    finally:
        sampler.stop()
    dimensions = {r["Dimension"] for r in records}
    assert {"CPUUtilization", "I/OWaitPercentage", "MemoryUtilization"} <= dimensions, dimensions
    assert "DataLoaderWorkers" not in dimensions


def test_nvidia_smi_csv_becomes_utilization_and_memory_share() -> None:
    assert parse_nvidia_smi("87, 20480, 81920\n0, 0, 81920\n[N/A], 1, 2\n") == [
        (87.0, 25.0),
        (0.0, 0.0),
    ]


def test_each_rank_appends_one_line_per_step(tmp_path: Path) -> None:
    for rank in (0, 1):
        timeline = StepTimeline(tmp_path, rank, "algo-1")
        timeline.record(step=1, epoch=0, start=10.0, data_wait=0.1, compute=0.3, communication=0.1, loss=2.5)
        timeline.record(step=2, epoch=0, start=10.5, data_wait=0.0, compute=0.4, communication=0.0, loss=float("nan"))
        timeline.record(step=2, epoch=0, start=11.0, data_wait=0.0, compute=0.2, communication=0.0, phase="EVAL")
        timeline.close()
    # A resumed job appends to the same file.
    again = StepTimeline(tmp_path, 0, "algo-1")
    again.record(step=3, epoch=1, start=12.0, data_wait=0.0, compute=0.4, communication=0.0)
    again.close()
    lines = (tmp_path / "steps" / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 4, lines
    first = json.loads(lines[0])
    assert first["duration"] == pytest.approx(0.5) and first["phase"] == "TRAIN" and first["loss"] == 2.5
    assert json.loads(lines[1])["loss"] is None, "a NaN loss is written as null, valid JSON"
    assert sum(len(path.read_text().splitlines()) for path in (tmp_path / "steps").glob("rank*.jsonl")) == 7
    with pytest.raises(ValueError, match="phase"):
        again.record(step=4, epoch=1, start=13.0, data_wait=0, compute=0, communication=0, phase="PREDICT")


class _FakeNvml:
    """pynvml's calls the sampler makes, for two GPUs: one busy, one idle."""

    class _Rates:
        def __init__(self, gpu: int) -> None:
            self.gpu = gpu

    class _Memory:
        def __init__(self, used: int) -> None:
            self.used, self.total = used, 80 * 2**30

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _FakeNvml._Rates:
        return self._Rates(97 if handle == 0 else 0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _FakeNvml._Memory:
        return self._Memory(60 * 2**30 if handle == 0 else 0)


def test_gpus_are_read_through_nvml_when_it_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=500)
    assert sampler.gpu_source == "nvml"
    sampler.start()
    try:
        records = sampler.sample()
    finally:
        sampler.stop()
    gpus = {(r["Name"], r["Dimension"]): r["Value"] for r in records if r["Type"] == "gpu"}
    assert gpus == {
        ("gpu0", "GPUUtilization"): 97.0,
        ("gpu0", "GPUMemoryUtilization"): 75.0,
        ("gpu1", "GPUUtilization"): 0.0,
        ("gpu1", "GPUMemoryUtilization"): 0.0,
    }


def test_without_nvml_or_nvidia_smi_there_are_no_gpu_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setattr("trainer.profiling.monitor.shutil.which", lambda name: None)
    sampler = SystemMonitor(tmp_path, node="algo-1", interval_ms=500)
    assert sampler.gpu_source == "none"
