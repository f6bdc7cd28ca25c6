"""Process-group set-up from whichever launcher started the process, and the few collectives the
trainer needs.

Three ways to start (`resolve_launch` tells them apart from the environment alone):

- torchrun (SageMaker's `torch_distributed`, and `retrain train`): it sets RANK, LOCAL_RANK,
  WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process.
- mpirun (SageMaker's SMDDP launcher, `smdistributed.dataparallel`): Open MPI sets
  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE and nothing of torch's. The training
  toolkit's mpirun exports no master address either, and no `sagemaker_*` hyperparameter names
  one: the toolkit's own master is the first of the job's hosts (`SM_HOSTS`, also in
  `SM_TRAINING_ENV`), so that is where rank 0 listens, on torch's default port unless
  MASTER_ADDR / MASTER_PORT say otherwise.
- neither: one process, no process group.

Every helper here is also correct in the single-process case, so the training loop has no
`if distributed` branches of its own.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: its functions take `group=group.WORLD` as
# a default argument, evaluated at import. Imported later (DDP does so lazily), those defaults hold
# the default group for the life of the interpreter, so `destroy_process_group` cannot free it and
# gloo's worker threads run on into interpreter shutdown, where one that releases a finished
# collective's tensors needs the GIL and aborts the process ("terminate called without an active
# exception", SIGABRT) after the run has finished. See `cleanup`.
import torch.distributed.nn

BackendChoice = Literal["torch", "smddp"]
Launcher = Literal["torchrun", "mpi", "single"]

# The module whose import registers the "smddp" process-group backend (SageMaker images only).
SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"
# torchrun's default --master-port; mpirun chooses none. (SMDDP's own server uses 7592.)
DEFAULT_MASTER_PORT = 29500


class LaunchError(RuntimeError):
    """The environment names a launcher, but not enough to join its process group."""


class BackendUnavailableError(RuntimeError):
    """The process-group backend asked for cannot run here."""


@dataclass(frozen=True)
class Launch:
    """Who started this process, and where it stands in the job."""

    launcher: Launcher
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    launcher: Launcher = "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_launch(environ: Mapping[str, str]) -> Launch:
    """torchrun's variables, else Open MPI's, else a single process."""
    if "WORLD_SIZE" in environ:
        return _torchrun(environ)
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return _mpi(environ)
    return Launch("single")


def _torchrun(environ: Mapping[str, str]) -> Launch:
    world_size = _number(environ, "WORLD_SIZE")
    if "RANK" not in environ:
        raise LaunchError(f"WORLD_SIZE={world_size} but no RANK: start the trainer with torchrun (or unset WORLD_SIZE)")
    return _checked(
        Launch(
            "torchrun",
            rank=_number(environ, "RANK"),
            local_rank=_number(environ, "LOCAL_RANK", 0),
            world_size=world_size,
            local_world_size=_number(environ, "LOCAL_WORLD_SIZE", world_size),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=_number(environ, "MASTER_PORT") if "MASTER_PORT" in environ else None,
        )
    )


def _mpi(environ: Mapping[str, str]) -> Launch:
    world_size = _number(environ, "OMPI_COMM_WORLD_SIZE")
    local_world_size = _number(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", world_size)
    return _checked(
        Launch(
            "mpi",
            rank=_number(environ, "OMPI_COMM_WORLD_RANK"),
            local_rank=_number(environ, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            world_size=world_size,
            local_world_size=local_world_size,
            master_addr=_mpi_master(environ, single_host=local_world_size == world_size),
            master_port=_number(environ, "MASTER_PORT", DEFAULT_MASTER_PORT),
        )
    )


def _mpi_master(environ: Mapping[str, str], *, single_host: bool) -> str:
    """MASTER_ADDR, else the job's first host (SageMaker's master), else this host if it is all."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    hosts = _sagemaker_hosts(environ)
    if hosts:
        return hosts[0]
    if single_host:
        return "127.0.0.1"
    raise LaunchError(
        "mpirun started ranks on several hosts, but neither MASTER_ADDR nor SM_HOSTS (nor "
        "SM_TRAINING_ENV's hosts) says which host rank 0 is on: export MASTER_ADDR to the ranks "
        "(mpirun -x MASTER_ADDR=...)"
    )


def _sagemaker_hosts(environ: Mapping[str, str]) -> list[str]:
    """The job's hosts in SageMaker's order (resourceconfig.json's, sorted): SM_HOSTS first."""
    for name, key in (("SM_HOSTS", None), ("SM_TRAINING_ENV", "hosts")):
        try:
            value = json.loads(environ.get(name) or "null")
        except ValueError as error:
            raise LaunchError(f"{name} is not JSON ({error}): it should be what SageMaker set") from error
        hosts = value.get(key) if key is not None and isinstance(value, dict) else value
        if isinstance(hosts, list) and hosts and all(isinstance(host, str) for host in hosts):
            return hosts
    return []


def _number(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    if name not in environ and default is not None:
        return default
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise LaunchError(f"{name}={environ.get(name)!r} is not a whole number") from None


def _checked(launch: Launch) -> Launch:
    if not (0 <= launch.rank < launch.world_size and 0 <= launch.local_rank < launch.local_world_size):
        raise LaunchError(
            f"{launch.launcher}: rank {launch.rank} of {launch.world_size}, local rank "
            f"{launch.local_rank} of {launch.local_world_size} is not a place in a job"
        )
    return launch


def setup(choice: BackendChoice, environ: Mapping[str, str] | None = None) -> Context:
    """Join the process group the launcher describes (if any) on the right device and backend."""
    launch = resolve_launch(os.environ if environ is None else environ)
    cuda = torch.cuda.is_available()
    if cuda:
        # One GPU per process; NCCL (and all_gather_object) use the *current* device.
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    backend = _smddp_backend(cuda) if choice == "smddp" else ("nccl" if cuda else "gloo")
    if launch.launcher != "single" and not dist.is_initialized():
        # env:// rendezvous at rank 0's address; torchrun exported it already, mpirun did not.
        if launch.master_addr is not None:
            os.environ.setdefault("MASTER_ADDR", launch.master_addr)
        if launch.master_port is not None:
            os.environ.setdefault("MASTER_PORT", str(launch.master_port))
        dist.init_process_group(backend=backend, rank=launch.rank, world_size=launch.world_size)
    return Context(
        launch.rank,
        launch.local_rank,
        launch.world_size,
        launch.local_world_size,
        device,
        backend,
        launch.launcher,
    )


def _smddp_backend(cuda: bool) -> str:
    if not cuda:
        raise BackendUnavailableError("--backend smddp needs GPUs; on CPU use --backend torch (gloo)")
    try:
        importlib.import_module(SMDDP_MODULE)
    except ImportError as error:
        raise BackendUnavailableError(
            "--backend smddp needs the SageMaker distributed data parallel library "
            f"({SMDDP_MODULE}), which ships only in AWS's PyTorch training images for "
            "ml.p4d/ml.p4de/ml.p5 instances; use --backend torch (NCCL) elsewhere"
        ) from error
    return "smddp"


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (and return it); the identity in a single process."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(value: Any, source: int = 0) -> Any:
    """Rank `source`'s value on every rank: decisions only one rank can make (clock, files)."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=source)
    return holder[0]


def broadcast_flag(flag: bool, device: torch.device, source: int = 0) -> bool:
    """Rank `source`'s yes/no on every rank; a one-element tensor, cheap enough for every step."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.broadcast(tensor, src=source)
    return bool(tensor.item())


def any_rank(flags: Sequence[bool], device: torch.device) -> list[bool]:
    """Each flag, true on every rank if it is true on any: one all-reduce (MAX) of a few integers,
    cheap enough for every step (a few microseconds on NCCL, well under a millisecond on gloo)."""
    if not is_distributed():
        return list(flags)
    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(value) for value in tensor.tolist()]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's value, in rank order, on every rank."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Leave the process group so that nothing of it outlives this call.

    Call it once the ranks have left their last collective together (a barrier) and every thread
    of ours has stopped. Gloo runs each collective on worker threads of its own, and the worker
    that ran the last one releases it (and the tensors of earlier ones it kept) a moment after
    the ranks were let go. Those threads end only when the group object is freed; if it survives
    into interpreter shutdown, such a release waits for the GIL there and the process aborts
    with SIGABRT, failing a run whose model is already saved. So: free the reference cycles that
    hold the group (DDP's reducer sits in one) while the interpreter is alive, then destroy the
    group, which joins its worker threads (its destructor lets go of the GIL for that).
    """
    if not is_distributed():
        return
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
