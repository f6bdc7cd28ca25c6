"""Per-rank step timelines: `profile/steps/rank<r>.jsonl`, one line per step, append-only.

    {"rank": 0, "node": "algo-1", "phase": "TRAIN", "epoch": 3, "step": 120,
     "start": 1764687600.25, "duration": 0.41, "data_wait": 0.02, "compute": 0.37,
     "communication": 0.02, "loss": 1.93}

`start` is epoch seconds (the system records' clock); the three parts come from
`trainer/timing.py` (`split_step`) and add up to `duration`. EVAL lines time one validation batch
each, with `communication` 0 and no loss. Each line is flushed, so the file is readable while the
job runs, and a resumed job appends to the same file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

StepRecord = dict[str, Any]
PHASES = ("TRAIN", "EVAL")


def steps_file(profile_dir: Path, rank: int) -> Path:
    return profile_dir / "steps" / f"rank{rank}.jsonl"


class StepTimeline:
    """Appends this rank's steps to its file."""

    def __init__(self, profile_dir: Path, rank: int, node: str) -> None:
        self.path = steps_file(profile_dir, rank)
        self.rank, self.node = rank, node
        self._file: TextIO | None = None

    def record(
        self,
        *,
        step: int,
        epoch: int,
        start: float,
        data_wait: float,
        compute: float,
        communication: float,
        phase: str = "TRAIN",
        loss: float | None = None,
    ) -> StepRecord:
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {PHASES}")
        line: StepRecord = {
            "rank": self.rank,
            "node": self.node,
            "phase": phase,
            "epoch": epoch,
            "step": step,
            "start": round(start, 6),
            "duration": round(data_wait + compute + communication, 6),
            "data_wait": round(data_wait, 6),
            "compute": round(compute, 6),
            "communication": round(communication, 6),
        }
        if loss is not None:
            line["loss"] = loss if math.isfinite(loss) else None  # NaN is not JSON
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
