"""SIGTERM, turned into a clean stop: finish the step, write a checkpoint, exit.

SageMaker sends SIGTERM when a job is stopped (StopTrainingJob) and when a managed-spot instance
is reclaimed, then kills the container 120 seconds later. Under torchrun the signal reaches the
trainer through the launcher, which forwards it to each worker's process group and SIGKILLs what
is still running after its shutdown timeout: 30 s by default (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`),
which the training-job request raises to 100 s, inside SageMaker's 120. A stop must therefore fit
in that window: the handler only records the request, the step in progress finishes, every rank
learns of the stop at the same step boundary (`Checkpointer.decide`), rank 0 writes a checkpoint
(seconds, even for a large model), and every process exits with 128 + SIGTERM.

Loader workers share the worker's process group, so they receive the signal too; they ignore it
(`loader.worker_init`): their parent finishes its step with them and then shuts them down, as it
does at the end of every run.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_CODE = 128 + signal.SIGTERM
# What the training-job request sets, so torchrun waits for the checkpoint (SageMaker allows 120 s).
SHUTDOWN_TIMEOUT_SECONDS = 100


class Interrupted(Exception):  # noqa: N818 (an event, not an error)
    """Every rank stops here, after the checkpoint of `global_step`."""

    def __init__(self, global_step: int, signal_name: str) -> None:
        super().__init__(f"{signal_name} received: stopped after step {global_step}")
        self.global_step = global_step
        self.signal_name = signal_name


class StopRequest:
    """Remembers a SIGTERM (or SIGINT) until the training loop reaches a step boundary."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    def install(self) -> StopRequest:
        # Signal handlers can only be set from the main thread (a test may train in another).
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: FrameType | None) -> None:
        del frame
        # A second signal means "now": the default action, at once.
        if self.received is not None:
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)
        self.received = signal.Signals(number)

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return self.received.name if self.received is not None else "no signal"
