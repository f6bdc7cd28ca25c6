"""Freeing a run's lock: ReleaseFunction's one job, kept out of the trigger's reach.

The trigger is invoked by its schedule, by the sweeper and by the intake, which decodes untrusted
images; a Lambda function cannot tell who invoked it, so a release the trigger accepted could come
from any of them and free a running run's lock. ReleaseFunction is invoked only by the state
machine and RunEndedFunction (only their roles may: template.yaml, tests/unit/test_permissions.py)
and frees only the named holder's lock, by a conditional delete (`RunLock.release`); a caller
that still owes the team the run's message has the run's end recorded with it.

The look for new data that follows a release stays the trigger's: it is kicked, not run here. So
looks still take turns (the trigger's reserved concurrency of 1: a run's end never looks beside
the trigger still marking that run's pairs), and this function needs no right to start a run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from functions.common.requests import ReleaseInput, ReleaseOutcome
from functions.data.run_lock import RunLock


@dataclass(frozen=True)
class Release:
    lock: RunLock
    # Asks the trigger to look now, with the reason (`functions/trigger/kick.py`, from the wiring).
    kick: Callable[[str], None]

    def handle(self, request: ReleaseInput) -> ReleaseOutcome:
        ended_by = request.source if request.owes_message else None
        released = self.lock.release(request.holder, ended_by=ended_by)
        # Freed now or before, the run has ended: data that came during it may start the next.
        self.kick(f"{request.source}: {request.holder} released the lock")
        return ReleaseOutcome(holder=request.holder, released=released)
