"""teardown_failed_runs: how many finished trainings died at teardown, out of many in a row.

    .venv/bin/python benchmarks/stress_teardown.py [--runs 100] [--resumed 100] [--interval-ms 100]

The harness of issue 29. A finished run must exit 0: once rank 0 has saved the model and the
report, no rank may abort while the process group goes away. It runs the tiny two-process
training of `tests/trainer/test_profiling_training.py` (48 synthetic 64x32 scenes, 2 epochs,
width 0.25, profiling every 100 ms) `--runs` times under torchrun, then `--resumed` times the
path whose teardown differs: a run stopped by SIGTERM mid-epoch (it checkpoints and exits
143, every rank cleanly) and the same run resumed to the end (exit 0).

A run fails when torchrun's exit code is not the expected one, or when any rank's output shows
an abort ("terminate called", SIGABRT, a signal exit). Its log is kept under `--keep` and named.
Prints `name: value` lines:

- `teardown_runs`, `teardown_failed_runs`, `teardown_seconds_per_run`;
- `teardown_resumed_runs`, `teardown_resumed_failed_runs`, `teardown_seconds_per_resumed_run`
  (the stopped run and its resumption together).

Not part of `make bench` (about 8 minutes for 100 runs and 12 for 100 resumed ones on two cores):
`make stress-teardown` runs it with the defaults. Exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrain.synth import default_version, write_scenes  # noqa: E402

COUNT, SIZE, SEED = 48, (64, 32), 1
TINY_RUN = [
    *("--width", "0.25", "--crop", "64x32", "--batch-size", "4", "--lr", "0.1", "--workers", "0"),
    *("--checkpoint-every-seconds", "0"),
]
# What a rank that died at teardown leaves in torchrun's output.
ABORTED = re.compile(r"terminate called|SIGABRT|exitcode\s*:\s*-\d+|Fatal Python error")
# Where the stopped run is signalled: mid-epoch 2 of 4 (steps of 4 per epoch).
STOP_AT = "epoch 2/4 step 2/"
STOPPED_EXIT_CODE = 128 + signal.SIGTERM


def torchrun(scenes: Path, out: Path, extra: list[str], interval_ms: int) -> subprocess.Popen[str]:
    manifest = f"manifests/{default_version(SEED, COUNT, SIZE)}.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    for name in ("SM_CHANNEL_TRAIN", "SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHANNEL_MODEL"):
        env.pop(name, None)
    argv = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("-m", "trainer.train", "--data-dir", str(scenes), "--manifest", manifest),
        *("--model-dir", str(out / "model"), "--output-data-dir", str(out / "output")),
        *("--checkpoint-dir", str(out / "checkpoints"), "--profiling-interval-ms", str(interval_ms)),
        *TINY_RUN,
        *extra,
    ]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def finish(process: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -9, output + "\n[stress_teardown: killed after the timeout]"
    return process.returncode, output


def judged(code: int, log: str, expected: int) -> str | None:
    """Why this run failed, or None."""
    if ABORTED.search(log):
        return f"a rank aborted: {ABORTED.search(log).group(0)!r}"  # type: ignore[union-attr]
    if code != expected:
        return f"exit code {code}, expected {expected}"
    return None


def plain_run(scenes: Path, out: Path, interval_ms: int) -> tuple[str | None, str]:
    code, log = finish(torchrun(scenes, out, ["--epochs", "2", "--log-every", "0"], interval_ms))
    if code == 0 and not (out / "model" / "model.pt").exists():
        return "exit 0 but no model.pt", log
    return judged(code, log, 0), log


def resumed_run(scenes: Path, out: Path, interval_ms: int) -> tuple[str | None, str]:
    extra = ["--epochs", "4", "--log-every", "1"]
    running = torchrun(scenes, out, extra, interval_ms)
    assert running.stdout is not None
    seen: list[str] = []
    for line in running.stdout:
        seen.append(line)
        if STOP_AT in line:
            running.send_signal(signal.SIGTERM)
            break
    code, rest = finish(running)
    log = "".join(seen) + rest
    if "SIGTERM received: stopped after step" not in log:
        return f"the run was not stopped by SIGTERM (exit {code})", log
    # torchrun reports its workers' 143 as a failure of its own; what matters is how they ended.
    worker_codes = [int(found) for found in re.findall(r"exitcode\s*:\s*(-?\d+)", log)]
    if ABORTED.search(log) or any(found not in (STOPPED_EXIT_CODE, 0) for found in worker_codes):
        return f"the stopped run did not end cleanly (exit {code}, workers {worker_codes})", log
    code, resumed = finish(torchrun(scenes, out, extra, interval_ms))
    log = f"{log}\n--- resumed ---\n{resumed}"
    if code == 0 and "resumed from" not in resumed:
        return "the second run did not resume", log
    return judged(code, resumed, 0), log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="finished two-process runs")
    parser.add_argument("--resumed", type=int, default=100, help="SIGTERM-then-resume pairs")
    parser.add_argument("--interval-ms", type=int, default=100, help="the profiler's sampling interval")
    parser.add_argument("--keep", type=Path, default=Path("stress-teardown"), help="where failed runs' logs go")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="stress-teardown-"))
    failures = 0
    try:
        scenes = work / "scenes"
        write_scenes(scenes, count=COUNT, size=SIZE, seed=SEED)
        for kind, count, run in (("", args.runs, plain_run), ("resumed_", args.resumed, resumed_run)):
            failed, started = 0, time.perf_counter()
            for index in range(1, count + 1):
                out = work / "run"
                shutil.rmtree(out, ignore_errors=True)
                why, log = run(scenes, out, args.interval_ms)
                if why is not None:
                    failed += 1
                    args.keep.mkdir(parents=True, exist_ok=True)
                    kept = args.keep / f"{kind or 'plain_'}{index}.log"
                    kept.write_text(log, encoding="utf-8")
                    print(f"# {kind or 'plain '}run {index}: {why} (log: {kept})", file=sys.stderr)
                elif index % 10 == 0:
                    print(f"# {kind or 'plain '}runs: {index}/{count}, {failed} failed", file=sys.stderr)
            seconds = time.perf_counter() - started
            print(f"teardown_{kind}runs: {count}")
            print(f"teardown_{kind}failed_runs: {failed}")
            if count:
                print(f"teardown_seconds_per_{kind}run: {seconds / count:.2f}")
            failures += failed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
