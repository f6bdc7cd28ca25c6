"""The one place that knows the data bucket's layout (DESIGN.md section 3)."""

from __future__ import annotations

INCOMING = "incoming/"
DATASET = "dataset/"
MANIFESTS = "dataset/manifests/"
QUARANTINE = "quarantine/"
REPORTS = "reports/"


def batch_of(key: str) -> str | None:
    """`incoming/<batch>/...` -> `<batch>`; None for a key outside the landing zone."""
    if not key.startswith(INCOMING):
        return None
    batch, sep, rest = key[len(INCOMING) :].partition("/")
    return batch if batch and sep and rest else None


def manifest_key(dataset_version: str) -> str:
    return f"{MANIFESTS}{dataset_version}.jsonl"
