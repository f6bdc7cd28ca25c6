"""The manifest's pins, checked: every file the trainer reads is hashed and compared with it.

A dataset version's manifest pins the exact bytes of every image and label (`image_sha256`,
`label_sha256`, and the S3 VersionIds they came from). FSx for Lustre, though, presents the
*newest* bytes of each S3 key: a label re-drawn or an image overwritten after the version was
frozen would be trained on silently, and the run's lineage ("trained on version V") would be false.

So the loader worker that reads a file hashes the very bytes it is about to decode (nothing is
read twice) and compares the digest with the manifest's. The cost is small: hashlib's SHA-256 runs
at about 1.8 GB/s on a core with the SHA extensions (0.1 ms for a 200 KB JPEG, 1 ms for a 2 MB
Cityscapes PNG) against 10-40 ms to decode and augment the pair, and in a worker process it holds
no lock anyone else wants (hashlib also releases the GIL for buffers over 2 KiB).

What a pair whose bytes differ does: it is *skipped*, not trained on. The worker hands over a blank
sample in its place (a black image whose every label pixel is ignore), so it adds nothing to the
loss, its gradient or the validation confusion matrix, and the batch keeps its shape. Its unknown
bytes are not even decoded: a changed file may not be a valid image any more. (In training mode
the black image still takes part in BatchNorm's batch statistics, as padding does.)

How verdicts are counted: workers are separate processes, so each split keeps a table in shared
memory with one byte per pair (checked, image differs, label differs), written by whichever worker
read the pair and read by the training process. At each evaluated epoch the ranks OR their tables
(one all-reduce), so every rank sees the same distinct pairs, however the samplers spread them and
whichever rank read a file twice. A split's mismatch fraction (pairs that differ / pairs in the
split) above `--max-checksum-mismatch-fraction` fails the run on every rank alike, after rank 0
has recorded the report, with the first offending files, in `metrics.json`.

The tables cover the run since this process started: a run resumed from a checkpoint counts again
from the files it reads after the restart (every file of the train split is read again each epoch).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainer import distributed

log = logging.getLogger("trainer")

# The bits of a pair's byte in a table.
CHECKED = 1
IMAGE_DIFFERS = 2
LABEL_DIFFERS = 4
_BITS = (CHECKED, IMAGE_DIFFERS, LABEL_DIFFERS)
# Offending files named, per split, in metrics.json and in the log line (which SageMaker's
# FailureReason quotes, in at most 1024 characters).
FIRST_FILES = 10
FIRST_NAMED = 3
# What to do when the trainer cannot check: the flag that turns the check off.
OFF_FLAG = "--verify-checksums false"
FRACTION_FLAG = "--max-checksum-mismatch-fraction"


class Pinned(Protocol):
    """A manifest pair: two paths and the digests that pin their bytes."""

    @property
    def image(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def image_sha256(self) -> str: ...
    @property
    def label_sha256(self) -> str: ...


def verdict(pair: Pinned, image_bytes: bytes, label_bytes: bytes) -> int:
    """CHECKED, with IMAGE_DIFFERS and/or LABEL_DIFFERS for each file that is not what is pinned."""
    found = CHECKED
    if hashlib.sha256(image_bytes).hexdigest() != pair.image_sha256:
        found |= IMAGE_DIFFERS
    if hashlib.sha256(label_bytes).hexdigest() != pair.label_sha256:
        found |= LABEL_DIFFERS
    return found


def unpinned(pairs: Sequence[Pinned]) -> list[Pinned]:
    """The pairs whose manifest line lacks a digest: their bytes cannot be checked."""
    return [pair for pair in pairs if not pair.image_sha256 or not pair.label_sha256]


class ChecksumTable:
    """One byte per pair of a split, in shared memory: the verdicts of every loader worker.

    A shared tensor travels to workers as a handle on the same pages (whether they are forked or
    spawned), so a worker's write is what the training process reads; each pair's byte is written
    only by the worker that read it, and two reads of one pair agree, so no lock is needed.
    """

    def __init__(self, pairs: int) -> None:
        self.flags = torch.zeros(pairs, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self.flags)

    def record(self, index: int, found: int) -> None:
        # OR, not assignment: a file that differed once stays counted for the run.
        self.flags[index] = int(self.flags[index]) | found


@dataclass(frozen=True)
class SplitVerdict:
    """One split's pairs, over every rank: how many were checked, which differ."""

    split: str
    pairs: int
    checked: int
    # (path, expected sha256) of every file that differs, in manifest order.
    files: list[tuple[str, str]]
    mismatched: int

    @property
    def fraction(self) -> float:
        return self.mismatched / self.pairs if self.pairs else 0.0

    def report(self) -> dict[str, Any]:
        """The split's part of `metrics.json`'s `checksums`."""
        return {
            "pairs": self.pairs,
            "checked": self.checked,
            "mismatched": self.mismatched,
            "fraction": round(self.fraction, 6),
            "files": [{"path": path, "expected_sha256": digest} for path, digest in self.files[:FIRST_FILES]],
        }

    def describe(self) -> str:
        """`val: 1 of 10 pairs (10.0%) ...: labels/a.png (pinned sha256 ab12...), ...`"""
        named = ", ".join(f"{path} (pinned sha256 {digest[:12]})" for path, digest in self.files[:FIRST_NAMED])
        hidden = len(self.files) - FIRST_NAMED
        more = f" and {hidden} more files (metrics.json names up to {FIRST_FILES})" if hidden > 0 else ""
        return (
            f"{self.split}: {self.mismatched} of {self.pairs} pairs ({100 * self.fraction:.1f}%) "
            f"do not match the manifest's sha256: {named}{more}"
        )


@dataclass(frozen=True)
class Verdict:
    """Both splits, against the tolerance: what `metrics.json` records and whether the run fails."""

    max_fraction: float
    splits: list[SplitVerdict]

    @property
    def mismatched(self) -> list[SplitVerdict]:
        return [split for split in self.splits if split.mismatched]

    @property
    def failed(self) -> bool:
        return any(split.fraction > self.max_fraction for split in self.splits)

    def report(self) -> dict[str, Any]:
        """`metrics.json`'s `checksums` (modelled as `ChecksumReport` in functions/common)."""
        return {
            "enabled": True,
            "max_mismatch_fraction": self.max_fraction,
            **{split.split: split.report() for split in self.splits},
            "failed": self.failed,
        }

    def message(self) -> str:
        """The log line (within the tolerance) or the failure (above it)."""
        found = "; ".join(split.describe() for split in self.mismatched)
        if not self.failed:
            return f"{found}. Within {FRACTION_FLAG} {self.max_fraction:g}: those pairs are skipped."
        return (
            f"{found}. That is above {FRACTION_FLAG} {self.max_fraction:g}. FSx presents the newest "
            "bytes of each S3 key, and these keys no longer hold the bytes the dataset version froze: "
            "freeze a new dataset version, or restore these keys to the manifest's VersionIds."
        )


def disabled_report(max_fraction: float) -> dict[str, Any]:
    """`metrics.json`'s `checksums` when the check is off (`--verify-checksums false`)."""
    return {"enabled": False, "max_mismatch_fraction": max_fraction, "failed": False}


def collect(
    splits: Sequence[tuple[str, Sequence[Pinned], ChecksumTable]],
    device: torch.device,
    max_fraction: float,
) -> Verdict:
    """Every rank's tables ORed together (one all-reduce: a collective, every rank calls it)."""
    # Each bit as its own 0/1 row, summed over ranks: a bitwise OR that every backend can do.
    flags = torch.cat([table.flags for _, _, table in splits]).to(torch.int32)
    bits = torch.stack([(flags & bit) != 0 for bit in _BITS]).to(torch.int32)
    union = (distributed.all_reduce_sum(bits.to(device)).cpu() > 0).to(torch.int32)
    merged = sum((row * bit for row, bit in zip(union, _BITS, strict=True)), torch.zeros_like(flags))
    verdicts, start = [], 0
    for name, pairs, table in splits:
        mine = merged[start : start + len(table)].tolist()
        start += len(table)
        files = []
        for pair, found in zip(pairs, mine, strict=True):
            if found & IMAGE_DIFFERS:
                files.append((pair.image, pair.image_sha256))
            if found & LABEL_DIFFERS:
                files.append((pair.label, pair.label_sha256))
        verdicts.append(
            SplitVerdict(
                split=name,
                pairs=len(table),
                checked=sum(1 for found in mine if found & CHECKED),
                files=files,
                mismatched=sum(1 for found in mine if found & (IMAGE_DIFFERS | LABEL_DIFFERS)),
            )
        )
    return Verdict(max_fraction, verdicts)


class Checked(Protocol):
    """A dataset that checks its pairs as it reads them (`SegmentationDataset(verify=True)`)."""

    @property
    def entries(self) -> Sequence[Pinned]: ...
    @property
    def checksums(self) -> ChecksumTable | None: ...


def collect_splits(datasets: Mapping[str, Checked], device: torch.device, max_fraction: float) -> Verdict | None:
    """`collect` over the datasets that check (a collective); None when none does."""
    tables = [(name, data.entries, data.checksums) for name, data in datasets.items() if data.checksums is not None]
    return collect(tables, device, max_fraction) if tables else None


def enforce(found: Verdict, *, is_main: bool) -> None:
    """Say what differs (rank 0); above the tolerance, fail every rank once rank 0 has written.

    Call it on every rank, after rank 0 has written `metrics.json`: it waits for that (a barrier)
    before failing, since torchrun tears the job down as soon as one rank exits."""
    if not found.mismatched:
        return
    message = found.message()
    if not found.failed:
        if is_main:
            log.warning("checksums: %s", message)
        return
    if is_main:
        log.error("checksums: %s", message)
    distributed.barrier()
    raise SystemExit(f"checksums: {message}")
