"""The trainer picks its process-group backend from what the host has, and says what is missing."""

from __future__ import annotations

import pytest
import torch

from trainer import distributed


def test_without_torchrun_the_trainer_is_a_single_cpu_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    context = distributed.setup("torch")
    assert (context.rank, context.world_size, context.backend) == (0, 1, "gloo")
    assert context.is_main and not distributed.is_distributed()
    # Collectives degrade to identities, so the training loop needs no special case.
    assert distributed.broadcast_object("x") == "x" and distributed.gather_objects(3) == [3]
    assert torch.equal(distributed.all_reduce_sum(torch.ones(2)), torch.ones(2))


def test_smddp_on_a_cpu_host_is_refused_with_the_alternative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match=r"needs GPUs.*--backend torch"):
        distributed.setup("smddp")


def test_smddp_without_the_sagemaker_library_names_the_missing_module() -> None:
    with pytest.raises(RuntimeError, match=r"smdistributed\.dataparallel"):
        distributed._smddp_backend(cuda=True)
