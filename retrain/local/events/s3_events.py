"""S3 event notifications as AWS writes them: with the object's `versionId` and a `sequencer`.

moto's notifications name the key, size and ETag only. AWS's also carry the VersionId of the
version that was written (in a versioned bucket) and a sequencer that orders events of one key.
Without the VersionId the intake has to look up the key's *current* version when the event
arrives, which under a quick re-upload is the wrong one: offline would then fail where AWS does
not (and pass where AWS fails). So the offline stack adds both fields, exactly where AWS puts them
(`Records[].s3.object`), while it runs.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from moto.s3 import notifications

_lock = threading.Lock()
_active = 0
_original: Callable[..., dict[str, Any]] | None = None
# AWS's sequencers are opaque hex strings that grow per key; one counter for all keys is enough.
_sequence = itertools.count(1)


def _with_version(event_name: str, bucket: Any, key: Any, notification_id: str) -> dict[str, list[dict[str, Any]]]:
    assert _original is not None
    event = _original(event_name, bucket, key, notification_id)
    for record in event["Records"]:
        obj = record["s3"]["object"]
        version = getattr(key, "version_id", None)
        # An unversioned bucket's objects have version "null": AWS then sends no versionId.
        if version and version != "null":
            obj["versionId"] = version
        obj["sequencer"] = f"{next(_sequence):016X}"
    return event


@contextmanager
def aws_shaped_events() -> Iterator[None]:
    """While inside, moto's S3 notifications carry `versionId` and `sequencer` (nestable)."""
    global _active, _original  # noqa: PLW0603 (one patch of one module, counted)
    with _lock:
        if _active == 0:
            # moto has no hook for this: the one function that shapes the event is replaced.
            _original = notifications._get_s3_event
            notifications._get_s3_event = _with_version
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _original is not None:
                notifications._get_s3_event = _original
                _original = None
