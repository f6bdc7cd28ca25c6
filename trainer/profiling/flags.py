"""The profiling hyperparameters, and the `Profiler` they configure for one rank."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.profiling import monitor
from trainer.profiling.session import MODES, Profiler

if TYPE_CHECKING:
    from trainer.distributed import Context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The "profiling and rules" group of the trainer's flags."""
    env = os.environ.get
    profiling = parser.add_argument_group("profiling and rules (trainer/profiling/)")
    profiling.add_argument(
        "--profiling",
        choices=MODES,
        # With SageMaker Debugger profiling the job (RETRAIN_PROFILING=debugger), we stay out.
        default={"debugger": "off"}.get(env("RETRAIN_PROFILING", ""), env("RETRAIN_PROFILING")) or "builtin",
        help="builtin: sample the hosts, time every step, evaluate the rules, write report.html "
        "(default; RETRAIN_PROFILING); off: none of it",
    )
    profiling.add_argument(
        "--profiling-interval-ms",
        type=int,
        choices=monitor.ALLOWED_INTERVALS_MS,
        default=int(env("RETRAIN_PROFILING_INTERVAL_MS", str(monitor.DEFAULT_INTERVAL_MS))),
        help="system sampling interval in ms, as SageMaker's ProfilerConfig allows (RETRAIN_PROFILING_INTERVAL_MS)",
    )
    profiling.add_argument(
        "--rules-every-seconds",
        type=float,
        default=0.0,
        help="rank 0 evaluates the rules this often while training (0: at the end only, unless "
        "--stop-on-rule asks for 300 s)",
    )
    profiling.add_argument(
        "--stop-on-rule",
        default="",
        help="comma-separated rules that stop the run when they find issues (e.g. LossNotDecreasing)",
    )
    profiling.add_argument(
        "--rule-parameters",
        default="",
        help='per-rule overrides as JSON, e.g. \'{"DataStall": {"threshold": 0.3}}\'',
    )


def make_profiler(args: argparse.Namespace, context: Context, loader_info: dict[str, Any]) -> Profiler:
    """This rank's profiler, as the flags above ask (not started yet)."""
    stop_on = [name.strip() for name in args.stop_on_rule.split(",") if name.strip()]
    every = args.rules_every_seconds or (300.0 if stop_on else 0.0)
    overrides = json.loads(args.rule_parameters) if args.rule_parameters else None
    return Profiler(
        Path(args.output_data_dir),
        mode=args.profiling,
        interval_ms=args.profiling_interval_ms,
        rank=context.rank,
        local_rank=context.local_rank,
        world_size=context.world_size,
        rules_every_seconds=every,
        stop_on=stop_on,
        overrides=overrides,
        loader=loader_info,
        device=context.device,
    )
