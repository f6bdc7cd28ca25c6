"""Reading the profiler's append-only JSON-lines files while they may still be written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

# Bytes read at a time: a 24-hour host file is gigabytes; one block's dicts live at a time.
READ_BLOCK_BYTES = 1 << 20
# What `JsonlTail` remembers of a file to notice it was replaced rather than appended to.
_HEAD_BYTES, _TAIL_BYTES = 512, 64


class JsonlTail:
    """One append-only JSON-lines file, read as it grows: `read()` parses only what is new.

    The offset after the last complete line is remembered, so each call parses only the lines
    appended since the previous one; a line still being written (no newline yet, and not yet
    valid JSON) is left for the next call. Every other line that is a JSON object is a record;
    a garbled one is skipped. A file that no longer starts with the bytes seen before, or that got
    shorter, was replaced (rank 0 writes other hosts' files whole when the job ends): `poll()`
    says so and reading starts again from its first byte.
    """

    def __init__(self, path: Path, *, block_bytes: int = READ_BLOCK_BYTES) -> None:
        self.path = path
        self.offset = 0
        self.block_bytes = block_bytes
        self._head = b""
        self._tail = b""

    def poll(self) -> bool:
        """True when the file was replaced (or removed) since the last read: start again."""
        if not self.offset:
            return False
        try:
            with self.path.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                same = size >= self.offset and handle.read(len(self._head)) == self._head
                if same and self._tail:
                    handle.seek(self.offset - len(self._tail))
                    same = handle.read(len(self._tail)) == self._tail
        except FileNotFoundError:
            same = False
        if not same:
            self.offset, self._head, self._tail = 0, b"", b""
        return not same

    def read(self) -> Iterator[list[dict[str, Any]]]:
        """The records of the lines completed since the last call, in batches of about a block."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return
        with handle:
            block = self.block_bytes
            while True:
                handle.seek(self.offset)
                chunk = handle.read(block)
                if not chunk:
                    return
                end = chunk.rfind(b"\n") + 1
                records = _parse(chunk[:end]) if end else []
                if len(chunk) < block and end < len(chunk):
                    # The end of the file, without a newline: a record only if it is whole.
                    last = _parse(chunk[end:])
                    if last:
                        records += last
                        end = len(chunk)
                if not end:
                    if len(chunk) < block:
                        return  # half a line: the writer has not finished it
                    block *= 2  # one line longer than a block
                    continue
                self._advance(handle, chunk[:end])
                if records:
                    yield records
                if len(chunk) < block:
                    return

    def _advance(self, handle: BinaryIO, consumed: bytes) -> None:
        if len(self._head) < _HEAD_BYTES:
            handle.seek(0)
            self._head = handle.read(min(_HEAD_BYTES, self.offset + len(consumed)))
        self._tail = (self._tail + consumed)[-_TAIL_BYTES:]
        self.offset += len(consumed)


def _parse(lines: bytes) -> list[dict[str, Any]]:
    """Every line that is a JSON object; others (cut short, garbled) are skipped."""
    kept = [line for line in lines.splitlines() if line.strip()]
    parsed = _parse_together(kept)
    if parsed is None:
        parsed = []
        for line in kept:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue
    return [record for record in parsed if isinstance(record, dict)]


def _parse_together(lines: list[bytes]) -> list[Any] | None:
    """One parse for the whole batch, faster than one per line; it stands only when it gives one
    value per line (two broken lines never join into one record), else None."""
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) and len(parsed) == len(lines) else None
