"""What a run needs to be reproduced: the exact code, and where it ran."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from trainer.distributed import Context


def code_sha256(folder: Path | None = None) -> str:
    """One digest of the trainer's own source files (names and bytes), in name order."""
    folder = folder or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def host_info(context: Context) -> dict[str, Any]:
    """Host, software and device; the SageMaker job and image when the environment names them."""
    training_env: dict[str, Any] = {}
    try:
        training_env = json.loads(os.environ.get("SM_TRAINING_ENV", "{}"))
    except ValueError:
        training_env = {}
    cuda = context.device.type == "cuda"
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python_version": sys.version.split()[0],
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": str(context.device.type),
        "device_name": torch.cuda.get_device_name(context.device) if cuda else platform.processor() or None,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "world_size": context.world_size,
        "local_world_size": context.local_world_size,
        "backend": context.backend,
        "cpu_count": os.cpu_count(),
        # Set by whoever builds the job (the request builder passes the image URI through).
        "training_image": os.environ.get("TRAINING_IMAGE_URI") or None,
        "training_job": training_env.get("job_name"),
        "current_host": training_env.get("current_host"),
        "hosts": training_env.get("hosts"),
    }
