"""Every step splits into data wait, compute and communication, per rank, honestly measured."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from functions.common.contracts import MetricsFile, scrape_metrics
from retrain.synth import default_version, write_scenes
from trainer.timing import AllReduceTimer, _exposed, _union, fractions, split_step

ROOT = Path(__file__).resolve().parents[2]


def test_overlapping_all_reduces_count_once() -> None:
    assert _union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == pytest.approx(4.0)
    assert _union([(0.0, 4.0), (1.0, 2.0)]) == pytest.approx(4.0), "a nested interval adds 0"


def test_only_the_all_reduce_after_the_last_gradient_is_exposed() -> None:
    # Buckets ready at 0 and 3 (backward done at 3); all-reduces end at 2.5 and 3.5.
    assert _exposed([(0.0, 2.5), (3.0, 3.5)]) == pytest.approx(0.5)
    # A late first bucket still finishing after the last one started counts from that start.
    assert _exposed([(0.0, 4.0), (3.0, 3.5)]) == pytest.approx(1.0)


def test_a_step_splits_into_parts_that_add_up_to_it() -> None:
    wait, compute, communication = split_step(1.0, 0.2, 0.1)
    assert (wait, compute, communication) == pytest.approx((0.2, 0.7, 0.1))
    # Clocks of two kinds can disagree a little: the parts are clamped to the step.
    assert sum(split_step(1.0, 0.7, 0.6)) == pytest.approx(1.0)
    assert split_step(1.0, 0.7, 0.6)[1] == 0.0
    shares = fractions(10.0, 1.0, 8.5, 0.5)
    assert shares == pytest.approx({"stall_fraction": 0.1, "compute_fraction": 0.85, "communication_fraction": 0.05})
    assert fractions(0.0, 0.0, 0.0, 0.0)["stall_fraction"] == 0.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _gradients(rank: int, port: int, hooked: bool, out: Any) -> None:
    """One rank of a two-rank DDP step; puts (gradients, timer's numbers) from rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    # Small buckets: several all-reduces per backward, as a real model has.
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)),
        bucket_cap_mb=0.05,
    )
    timer = AllReduceTimer(torch.device("cpu"))
    if hooked:
        timer.attach(model)
    inputs = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    model(inputs).square().mean().backward()
    numbers = timer.collect()
    if rank == 0:
        # As lists: tensors would travel as shared memory that dies with this process.
        out.put(([p.grad.tolist() for p in model.parameters()], numbers))  # type: ignore[union-attr]
    # Both ranks done before either tears gloo down: a rank that destroys its group while the
    # other's last exchange is in flight aborts it ("terminate called without an active
    # exception", seen once in 900 tests).
    dist.barrier()
    dist.destroy_process_group()


def _ddp_step(hooked: bool) -> tuple[list[Any], tuple[float, float]]:
    # Spawned: a fork of this pytest process copies the locks its other threads (moto's, the
    # emulators') hold, and a rank then hangs on one of them for good.
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    port = _free_port()
    ranks = [context.Process(target=_gradients, args=(r, port, hooked, out)) for r in (0, 1)]
    for process in ranks:
        process.start()
    result: tuple[list[Any], tuple[float, float]] = out.get()
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a DDP rank failed ({process.exitcode})"
    return result


@pytest.mark.slow(seconds=10)
def test_the_timed_all_reduce_averages_gradients_exactly_as_ddp_does() -> None:
    plain, (in_flight_plain, _) = _ddp_step(hooked=False)
    timed, (in_flight, exposed) = _ddp_step(hooked=True)
    assert plain == timed, "the timing hook changed the averaged gradients"
    assert in_flight_plain == 0.0, "without the hook nothing is timed"
    assert in_flight > 0.0 and 0.0 <= exposed <= in_flight


@pytest.mark.slow(seconds=5)
def test_a_run_reports_where_every_ranks_step_time_went(tmp_path: Path) -> None:
    write_scenes(tmp_path / "scenes", count=48, size=(64, 32), seed=1)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in ("SM_CHANNEL_TRAIN", "SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHANNEL_MODEL"):
        env.pop(name, None)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "trainer.train",
        "--data-dir",
        str(tmp_path / "scenes"),
        "--dataset-version",
        default_version(1, 48, (64, 32)),
        "--model-dir",
        str(tmp_path / "model"),
        "--output-data-dir",
        str(tmp_path / "output"),
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--width",
        "0.25",
        "--crop",
        "64x32",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--log-every",
        "0",
        "--checkpoint-every-seconds",
        "0",
        "--workers",
        "1",
    ]
    result = subprocess.run(  # noqa: PLW1510 (the return code is asserted below)
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"run failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"

    metrics = MetricsFile.model_validate_json((tmp_path / "output" / "metrics.json").read_text())
    assert metrics.loader is not None and metrics.loader.workers == 1
    assert metrics.loader.decoder in {"simplejpeg", "turbojpeg", "opencv", "pillow"}
    for epoch in metrics.epochs:
        assert epoch.compute_fraction is not None and epoch.communication_fraction is not None
        total = epoch.stall_fraction + epoch.compute_fraction + epoch.communication_fraction
        assert total == pytest.approx(1.0, abs=1e-4), f"epoch {epoch.epoch}: parts sum to {total}"
        assert epoch.allreduce_fraction is not None and epoch.allreduce_fraction > 0
        assert epoch.ranks is not None and [r.rank for r in epoch.ranks] == [0, 1]
        for rank in epoch.ranks:
            parts = rank.data_wait_seconds + rank.compute_seconds + rank.communication_seconds
            assert parts == pytest.approx(rank.step_seconds, abs=1e-3)
            assert rank.communication_seconds <= rank.allreduce_seconds + 1e-3

    scraped = scrape_metrics(result.stdout)
    for name in ("train:compute_fraction", "train:communication_fraction"):
        assert len(scraped.get(name, [])) == len(metrics.epochs), f"{name}: {scraped.get(name)}"
