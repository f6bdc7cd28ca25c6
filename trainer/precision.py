"""Mixed precision: bf16 autocast where the GPU has it, else fp16 and a loss scaler; none on CPU."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def amp_dtype(enabled: bool, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for this run, or None for full fp32."""
    if not enabled or device.type != "cuda":
        # Not on CPU: autocast there is slow without bf16 hardware and would change what the
        # offline run and the tests reproduce.
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """`torch.autocast` at `dtype`; nothing at all for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler() -> Any:
    """A loss scaler for fp16 on CUDA."""
    # torch.amp.GradScaler is the spelling since torch 2.3; torch.cuda.amp's warns from 2.4 on.
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()
