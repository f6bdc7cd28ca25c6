"""A finished run never dies at teardown (issue 29).

The cause: gloo runs each collective on worker threads that end only when the process group
object is freed. DDP imports `torch.distributed.nn` lazily, whose functions keep the default
group as a default argument, and DDP's reducer sits in a reference cycle: both kept the group
alive past `destroy_process_group`, so its threads ran into interpreter shutdown, where one that
released a finished collective's tensors needed the GIL and aborted the rank (SIGABRT) after the
model was saved. `trainer.distributed` now imports that module before any group exists and
frees the cycles before destroying the group; these tests check that no thread survives it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A DDP job as the trainer runs one (the trainer's set-up, timing hook, collectives and
# teardown), which then says how many threads its process still has.
JOB = textwrap.dedent(
    """
    import os, threading
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from trainer import distributed, timing

    context = distributed.setup("torch")

    def train():
        # Returns, as train() does, leaving DDP's reference cycle for the collector.
        model = DistributedDataParallel(torch.nn.Linear(8, 4))
        timing.attach_timer(model, context.device)
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
        distributed.gather_objects({"rank": context.rank, "lines": ["x" * 100] * 50})
        distributed.barrier()

    train()
    distributed.cleanup()
    threads = len(os.listdir("/proc/self/task"))
    print(f"rank {context.rank}: {threads} threads left, python threads {threading.active_count()}", flush=True)
    """
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc (Linux)")
def test_no_thread_of_the_process_group_outlives_the_teardown(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB, encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    for rank in (0, 1):
        # The main thread alone: gloo's worker and transport threads were joined.
        assert f"rank {rank}: 1 threads left, python threads 1" in log, log[-3000:]


@pytest.mark.slow(seconds=45)
def test_the_teardown_harness_finds_no_aborted_run(tmp_path: Path) -> None:
    """The harness itself, briefly: finished runs and SIGTERM-then-resume runs all exit cleanly
    (`make stress-teardown` runs it 100 times each)."""
    argv = [
        *(sys.executable, str(ROOT / "benchmarks" / "stress_teardown.py")),
        *("--runs", "3", "--resumed", "2", "--keep", str(tmp_path / "failed")),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    figures = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert done.returncode == 0, done.stdout + done.stderr
    assert figures["teardown_runs"] == "3" and figures["teardown_failed_runs"] == "0", done.stdout
    assert figures["teardown_resumed_runs"] == "2" and figures["teardown_resumed_failed_runs"] == "0", done.stdout
