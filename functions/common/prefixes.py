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


def curated_key(batch: str, relative: str) -> str:
    """`images/<name>` of batch `b` -> `dataset/images/b/<name>` (labels alike)."""
    folder, _, name = relative.partition("/")
    return f"{DATASET}{folder}/{batch}/{name}"


def quarantine_key(batch: str, relative: str) -> str:
    return f"{QUARANTINE}{batch}/{relative}"


def reason_key(quarantined: str) -> str:
    return f"{quarantined}.reason.json"


def report_key(batch: str, name: str) -> str:
    return f"{REPORTS}{batch}/{name}"


def relative_to_batch(key: str) -> str:
    """`incoming/<batch>/images/x.jpg` -> `images/x.jpg`."""
    batch = batch_of(key)
    return key[len(INCOMING) + len(batch) + 1 :] if batch else key.removeprefix(INCOMING)
