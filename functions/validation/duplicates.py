"""Exact duplicates: the first key to claim an image's sha256 is its original.

The intake Lambda implements `ContentIndex` with a conditional put on DynamoDB
(`attribute_not_exists`), so two concurrent uploads of the same bytes cannot both win; the CLI
uses the in-memory index below.
"""

from __future__ import annotations

from typing import Protocol


class ContentIndex(Protocol):
    def claim(self, sha256: str, key: str) -> str | None:
        """Record `key` as the holder of `sha256` unless another key already holds it.

        Returns that other key (the original), or None when `key` is the original, including
        when `key` claims again (a redelivered event must not make a file its own duplicate).
        """
        ...


class InMemoryContentIndex:
    """A `ContentIndex` for one process: the CLI's run over a local folder."""

    def __init__(self) -> None:
        self._originals: dict[str, str] = {}

    def claim(self, sha256: str, key: str) -> str | None:
        original = self._originals.setdefault(sha256, key)
        return None if original == key else original
