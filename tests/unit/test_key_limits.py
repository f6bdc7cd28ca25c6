"""MAX_INCOMING_KEY_BYTES: every key the intake derives from a landing key of that length fits
S3's and DynamoDB's limits, and one byte more would not (the cap is as high as it can be)."""

from __future__ import annotations

import pytest

from functions.common import prefixes
from functions.common.prefixes import MAX_INCOMING_KEY_BYTES, S3_MAX_KEY_BYTES, VERSION_BUDGET_BYTES
from functions.data.ledger_pairs import HASHED_FILE_SK, MAX_SORT_KEY_BYTES, file_sort_key

VERSION = "v" * VERSION_BUDGET_BYTES


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _deep_key(start: str, length: int) -> str:
    """A landing key of `length` bytes under `start`, in segments a file name may have."""
    key = start + "d/" * ((length - len(start) - 1) // 2)  # then at least one "x": no trailing /
    return key + "x" * (length - len(key))


def _derived(key: str) -> dict[str, str]:
    """Every S3 key and ledger sort key the intake derives from a landing key it acts on."""
    batch = prefixes.batch_of(key) or prefixes.UNBATCHED
    relative = prefixes.relative_to_batch(key)
    quarantined = prefixes.quarantine_key(batch, relative)
    return {
        "curated": prefixes.curated_key(batch, relative),
        "quarantined": quarantined,
        "reason": prefixes.reason_key(quarantined),
        "unsafe": prefixes.reason_key(prefixes.unsafe_quarantine_key(key)),
        "file item": f"file#{key}#{VERSION}",  # the natural sort key, not its hashed fallback
    }


@pytest.mark.parametrize("start", ["incoming/", "incoming/b/", "incoming/munich-12/"], ids=["unbatched", "b", "munich"])
def test_every_key_derived_from_a_key_at_the_cap_fits(start: str) -> None:
    key = _deep_key(start, MAX_INCOMING_KEY_BYTES)
    assert _size(key) == MAX_INCOMING_KEY_BYTES

    derived = _derived(key)

    limits = dict.fromkeys(derived, S3_MAX_KEY_BYTES) | {"file item": MAX_SORT_KEY_BYTES}
    too_long = {name: _size(value) for name, value in derived.items() if _size(value) > limits[name]}
    assert not too_long
    assert file_sort_key(key, VERSION) == derived["file item"], "at the cap, the natural sort key is used"


def test_one_byte_over_the_cap_something_derived_would_not_fit() -> None:
    key = _deep_key("incoming/", MAX_INCOMING_KEY_BYTES + 1)

    assert _size(_derived(key)["file item"]) > MAX_SORT_KEY_BYTES


def test_a_file_item_whose_natural_sort_key_is_too_long_is_keyed_by_a_hash() -> None:
    key = _deep_key("incoming/b/", S3_MAX_KEY_BYTES)  # the longest key S3 takes

    first, again = file_sort_key(key, VERSION), file_sort_key(key, VERSION)

    assert first == again, "the same key and version find the same item"
    assert first.startswith(HASHED_FILE_SK)
    assert _size(first) <= MAX_SORT_KEY_BYTES
    assert file_sort_key(key, "another version") != first


def test_the_unsafe_quarantine_key_is_short_safe_and_stable() -> None:
    key = "incoming/../x/images/a.jpg"

    quarantined = prefixes.unsafe_quarantine_key(key)

    assert quarantined == prefixes.unsafe_quarantine_key(key)
    assert quarantined.startswith("quarantine/_unsafe/")
    assert ".." not in quarantined
    assert quarantined != prefixes.unsafe_quarantine_key("incoming/./x/images/a.jpg")
