"""The trainer joins the process group of whichever launcher started it (torchrun, SageMaker's MPI-based
SMDDP launcher, or none) and picks its backend from what the host has, saying what is missing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import distributed

ROOT = Path(__file__).resolve().parents[2]


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


TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "algo-1"}
# What SageMaker's SMDDP launcher (mpirun, one rank per GPU) leaves in a rank's environment.
MPI = {
    "OMPI_COMM_WORLD_RANK": "9",
    "OMPI_COMM_WORLD_SIZE": "16",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    "SM_HOSTS": '["algo-1", "algo-2"]',
}


def test_each_launchers_environment_is_told_apart() -> None:
    assert distributed.resolve_launch({}) == distributed.Launch("single")
    assert distributed.resolve_launch(TORCHRUN) == distributed.Launch(
        "torchrun", rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="algo-1"
    )
    mpi = distributed.resolve_launch(MPI)
    assert (mpi.launcher, mpi.rank, mpi.local_rank, mpi.world_size, mpi.local_world_size) == ("mpi", 9, 1, 16, 8)
    # mpirun exports no rendezvous: rank 0 is on SageMaker's first host, on torch's default port.
    assert (mpi.master_addr, mpi.master_port) == ("algo-1", distributed.DEFAULT_MASTER_PORT)
    # torchrun's variables win where both are present (torchrun started inside an MPI job).
    assert distributed.resolve_launch({**MPI, **TORCHRUN}).launcher == "torchrun"


def test_the_mpi_master_comes_from_the_training_env_when_sm_hosts_is_absent() -> None:
    environ = {key: value for key, value in MPI.items() if key != "SM_HOSTS"}
    environ["SM_TRAINING_ENV"] = '{"hosts": ["algo-2", "algo-3"], "current_host": "algo-3"}'
    assert distributed.resolve_launch(environ).master_addr == "algo-2"
    assert distributed.resolve_launch({**environ, "MASTER_ADDR": "10.0.0.5"}).master_addr == "10.0.0.5"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({k: v for k, v in MPI.items() if k != "SM_HOSTS"}, r"several hosts.*MASTER_ADDR"),
        ({"WORLD_SIZE": "2"}, r"no RANK: start the trainer with torchrun"),
        ({**TORCHRUN, "RANK": "4"}, r"rank 4 of 4"),
        ({**MPI, "OMPI_COMM_WORLD_RANK": "nine"}, r"OMPI_COMM_WORLD_RANK='nine' is not a whole number"),
        ({**MPI, "SM_HOSTS": "algo-1"}, r"SM_HOSTS is not JSON"),
    ],
)
def test_an_environment_that_cannot_make_a_process_group_is_refused_plainly(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(distributed.LaunchError, match=message):
        distributed.resolve_launch(environ)


# Joins the process group from the environment it was given, then sums its rank over the group.
_MEMBER = """
import json, sys, torch
from trainer import distributed
context = distributed.setup("torch")
total = distributed.all_reduce_sum(torch.tensor([context.rank + 1.0]))
print(json.dumps({"launcher": context.launcher, "rank": context.rank, "world": context.world_size,
                  "local_rank": context.local_rank, "sum": float(total.item())}))
distributed.cleanup()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(extra: dict[str, str]) -> dict[str, str]:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SM_HOSTS")
    base = {key: value for key, value in os.environ.items() if key not in names and not key.startswith("OMPI_")}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize("launcher", ["mpi", "torchrun"])
def test_two_processes_started_as_each_launcher_starts_them_form_one_group(launcher: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the members would pick NCCL")
    port = str(_free_port())

    def rank_environment(rank: int) -> dict[str, str]:
        if launcher == "mpi":
            # As mpirun on one host: Open MPI's variables only, no MASTER_ADDR (the trainer finds it).
            return {
                "OMPI_COMM_WORLD_RANK": str(rank),
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "MASTER_PORT": port,
            }
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }

    members = [
        subprocess.Popen(
            [sys.executable, "-c", _MEMBER],
            cwd=ROOT,
            env=_environment(rank_environment(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [member.communicate(timeout=120) for member in members]
    for member, (_, error) in zip(members, outputs, strict=True):
        assert member.returncode == 0, error[-2000:]
    seen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    assert [(s["launcher"], s["rank"], s["world"], s["local_rank"]) for s in seen] == [
        (launcher, 0, 2, 0),
        (launcher, 1, 2, 1),
    ]
    assert [s["sum"] for s in seen] == [3.0, 3.0], "an all-reduce over the group must see both ranks"
