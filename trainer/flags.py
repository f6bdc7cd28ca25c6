"""The trainer's flags: every hyperparameter `python -m trainer.train` takes, one group per helper.

SageMaker passes each hyperparameter as `--name value`, all of them strings, so booleans take
`true`/`false` (`str2bool`); the data and output folders default to the SageMaker environment.
The profiling and screening groups are their packages' own (`profiling/flags.py`,
`screening/phase.py`). `trainer.train` re-exports `get_args_parser`, its entry point's parser.
"""

from __future__ import annotations

import argparse
import os

from trainer.data import DEFAULT_JITTER
from trainer.decode import DECODERS
from trainer.profiling import flags as profiling_flags
from trainer.screening import phase as screening_phase

# The 19 Cityscapes training classes. The trainer imports nothing from functions/, so the default
# taxonomy is repeated here; a test checks that the two lists agree.
CITYSCAPES_CLASSES = (
    "road,sidewalk,building,wall,fence,pole,traffic light,traffic sign,vegetation,terrain,sky,"
    "person,rider,car,truck,bus,train,motorcycle,bicycle"
)


def str2bool(text: str) -> bool:
    """SageMaker passes every hyperparameter as a string: "true", "True", "1" and the opposites."""
    value = text.strip().lower()
    if value in {"true", "1", "yes", "y", "on"}:
        return True
    if value in {"false", "0", "no", "n", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag(group: argparse._ArgumentGroup, name: str, default: bool, description: str) -> None:
    """A boolean hyperparameter: `--name true|false` (SageMaker's form), or a bare `--name`."""
    group.add_argument(
        name,
        type=str2bool,
        nargs="?",
        const=True,
        default=default,
        metavar="BOOL",
        help=description,
    )


def _checksum_flags(group: argparse._ArgumentGroup) -> None:
    """The manifest's pins (`checksums.py`): checked by default, any file that differs fails."""
    _flag(
        group,
        "--verify-checksums",
        True,
        "check every file read against the manifest's sha256 (false: for manifests without them)",
    )
    group.add_argument(
        "--max-checksum-mismatch-fraction",
        type=float,
        default=0.0,
        help="fail the run when more than this fraction of a split's pairs differ from the manifest "
        "(0: any does); pairs that differ are skipped either way",
    )


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train BiSeNetV2 on a frozen dataset version.")
    # One helper per group, in the order `--help` lists them.
    _data_flags(parser)
    _optimisation_flags(parser)
    _system_flags(parser)
    profiling_flags.add_arguments(parser)
    screening_phase.add_arguments(parser)
    _checkpoint_flags(parser)
    return parser


def _data_flags(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    io = parser.add_argument_group("data and outputs (defaults from the SageMaker environment)")
    io.add_argument(
        "--data-dir",
        default=env("SM_CHANNEL_TRAIN"),
        help="folder holding the manifest's images/, labels/ and manifests/",
    )
    io.add_argument(
        "--manifest",
        default=None,
        help="manifest, relative to --data-dir (default manifests/<version>.jsonl)",
    )
    io.add_argument(
        "--dataset-version",
        default=None,
        help="dataset version (default: the manifest's file name)",
    )
    io.add_argument("--model-dir", default=env("SM_MODEL_DIR"), help="where model.pt goes")
    io.add_argument(
        "--output-data-dir",
        default=env("SM_OUTPUT_DATA_DIR"),
        help="where metrics.json goes (it is also written beside the model)",
    )
    io.add_argument(
        "--checkpoint-dir",
        default="/opt/ml/checkpoints",
        help="resumable checkpoints; a restarted job resumes from the newest",
    )
    io.add_argument(
        "--init-from",
        default=None,
        help="model.pt, or a model.tar.gz as SageMaker writes it, to start from (default: the "
        "model.pt or model.tar.gz in $SM_CHANNEL_MODEL, if any)",
    )
    _flag(io, "--from-scratch", False, "start from random weights, ignoring any --init-from")
    io.add_argument(
        "--baseline-model",
        default=None,
        help="model.pt of the accepted model, evaluated on the same val split "
        "(default: $SM_CHANNEL_MODEL/model.pt if present)",
    )
    io.add_argument(
        "--classes",
        default=CITYSCAPES_CLASSES,
        help="comma-separated class names; a name's position is its train id",
    )
    _checksum_flags(io)


def _optimisation_flags(parser: argparse.ArgumentParser) -> None:
    opt = parser.add_argument_group("model and optimisation")
    opt.add_argument(
        "--width",
        type=float,
        default=1.0,
        help="channel width multiplier (1.0: the paper's BiSeNetV2, 3.4 M params)",
    )
    opt.add_argument("--epochs", type=int, default=100)
    opt.add_argument("--batch-size", type=int, default=8, help="images per process per micro-batch")
    opt.add_argument("--val-batch-size", type=int, default=0, help="0: same as --batch-size")
    opt.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    opt.add_argument("--lr", type=float, default=0.05, help="peak learning rate (SGD)")
    opt.add_argument("--momentum", type=float, default=0.9)
    opt.add_argument("--weight-decay", type=float, default=5e-4)
    opt.add_argument(
        "--warmup-steps",
        type=int,
        default=-1,
        help="linear warm-up steps (-1: 5%% of the run, at most 1000)",
    )
    opt.add_argument("--poly-power", type=float, default=0.9)
    opt.add_argument(
        "--aux-weight",
        type=float,
        default=1.0,
        help="weight of each booster head's loss (0: no booster heads)",
    )
    opt.add_argument(
        "--class-weighting",
        choices=("none", "balanced"),
        default="balanced",
        help="balanced: rare classes weigh more, from the manifest's class_pixels",
    )
    opt.add_argument("--crop", default="1024x512", help="training crop, WIDTHxHEIGHT")
    opt.add_argument(
        "--base-size",
        default=None,
        help="resize every image to WIDTHxHEIGHT before augmenting (default: as is)",
    )
    opt.add_argument("--scale-min", type=float, default=0.5, help="random scale, lower bound")
    opt.add_argument("--scale-max", type=float, default=2.0, help="random scale, upper bound")
    opt.add_argument(
        "--jitter",
        type=float,
        default=DEFAULT_JITTER,
        help="photometric jitter: brightness and contrast 1 +- this, colour 1 +- this/4 (0: off)",
    )
    opt.add_argument("--seed", type=int, default=0)


def _system_flags(parser: argparse.ArgumentParser) -> None:
    system = parser.add_argument_group("distributed, precision, loading")
    system.add_argument(
        "--backend",
        choices=("torch", "smddp"),
        default="torch",
        help="torch: NCCL on GPUs, gloo on CPU; smddp: SageMaker's, P4d/P4de/P5",
    )
    _flag(system, "--amp", True, "autocast on GPUs: bf16 where supported, else fp16 + scaler")
    _flag(system, "--channels-last", True, "channels-last memory format (GPUs only)")
    _flag(system, "--sync-bn", True, "SyncBatchNorm across ranks (GPUs only)")
    system.add_argument(
        "--workers",
        type=int,
        default=-1,
        help="loader workers per process (-1: the process's share of the cores less one on a GPU host, 0 on CPU)",
    )
    system.add_argument(
        "--prefetch-factor",
        type=int,
        default=0,
        help="batches each worker prepares ahead (0: about 8 per process, at least 2 each)",
    )
    system.add_argument(
        "--decoder",
        choices=("auto", *DECODERS),
        default="auto",
        help="JPEG decoder (auto: the fastest installed; Pillow always is)",
    )
    _flag(
        system,
        "--time-communication",
        True,
        "time DDP's all-reduces with a communication hook (compute/communication split)",
    )
    _flag(system, "--deterministic", False, "deterministic kernels (slower on GPUs)")


def _checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    ckpt = parser.add_argument_group("checkpoints and logging")
    ckpt.add_argument(
        "--checkpoint-every-steps",
        type=int,
        default=0,
        help="checkpoint every N optimizer steps too (0: off)",
    )
    ckpt.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=900.0,
        help="checkpoint whenever this long has passed (0: off)",
    )
    ckpt.add_argument("--keep-checkpoints", type=int, default=2)
    ckpt.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs (and after the last)")
    ckpt.add_argument("--log-every", type=int, default=20, help="progress line every N steps")
    ckpt.add_argument(
        "--stop-after-steps",
        type=int,
        default=0,
        help="test hook: exit after N optimizer steps, as an interruption would",
    )
