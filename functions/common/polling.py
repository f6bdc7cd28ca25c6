"""How long a run waits between two looks at something slow (an FSx import, a training job).

Every look costs about nine history events (Wait, Task, Choice) and a Standard execution stops at
25,000: the wait starts at the run's `poll_seconds`, doubles after each look, and is capped at the
run's `poll_max_seconds` (300 by default), raised so that even a job that runs its whole
MaxRuntime is looked at no more than `MAX_LOOKS` times (about 9,000 events).
"""

from __future__ import annotations

import math

DEFAULT_CAP_SECONDS = 300
MAX_LOOKS = 1000


def cap_for(expected_seconds: int, floor: int = DEFAULT_CAP_SECONDS) -> int:
    """The longest wait for something that may take `expected_seconds` (never below `floor`)."""
    return max(floor, math.ceil(expected_seconds / MAX_LOOKS))


def next_wait(first_seconds: int, looks: int, cap_seconds: int = DEFAULT_CAP_SECONDS) -> int:
    """The wait before look number `looks + 1`: first, 2x, 4x, ... up to the cap (0 stays 0)."""
    if first_seconds <= 0:
        return 0
    return int(min(cap_seconds, first_seconds * 2 ** min(looks, 30)))
