"""Process-group set-up from torchrun's environment, and the few collectives the trainer needs.

torchrun (SageMaker's `torch_distributed`) sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT for every process; without them the trainer runs as a single, non-distributed process.
Every helper here is also correct in that single-process case, so the training loop has no
`if distributed` branches of its own.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

BackendChoice = Literal["torch", "smddp"]

# The module whose import registers the "smddp" process-group backend (SageMaker images only).
SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(choice: BackendChoice) -> Context:
    """Join the process group torchrun describes (if any) on the right device and backend."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    cuda = torch.cuda.is_available()
    if cuda:
        # One GPU per process; NCCL (and all_gather_object) use the *current* device.
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    backend = _smddp_backend(cuda) if choice == "smddp" else ("nccl" if cuda else "gloo")
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        # env:// rendezvous: torchrun already put MASTER_ADDR/MASTER_PORT/RANK in the environment.
        dist.init_process_group(backend=backend)
    return Context(rank, local_rank, world_size, local_world_size, device, backend)


def _smddp_backend(cuda: bool) -> str:
    if not cuda:
        raise RuntimeError("--backend smddp needs GPUs; on CPU use --backend torch (gloo)")
    try:
        importlib.import_module(SMDDP_MODULE)
    except ImportError as error:
        raise RuntimeError(
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
    if is_distributed():
        dist.destroy_process_group()
