"""Names: anything that could escape a folder or hide a character is refused; people's names
in any script are welcome."""

from __future__ import annotations

import pytest

from functions.common.prefixes import MAX_INCOMING_KEY_BYTES
from functions.validation import (
    DEFAULT_CONFIG,
    KeyKind,
    ReasonCode,
    RejectedError,
    check_batch_safety,
    check_image,
    check_key_safety,
    check_landing_key,
    classify_key,
)

from .corpus import jpeg, png


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("images/../../etc/passwd.jpg", "'..'"),
        ("images/./a.jpg", "'.'"),
        ("/etc/images/a.jpg", "absolute"),
        ("C:images/a.jpg", "absolute"),
        ("images\\a.jpg", "backslash"),
        ("images/a\x00.jpg", "U+0000"),
        ("images/a\n.jpg", "U+000A"),
        ("images/a\x7f.jpg", "U+007F"),
        ("images/\u202egpj.png", "U+202E"),  # right-to-left override: reads as "png.jpg"
        ("images/a\u200b.jpg", "U+200B"),  # zero-width space
        ("images/a\u2028.jpg", "U+2028"),  # line separator
        ("images//a.jpg", "empty path segment"),
        ("images/caf\udce9.jpg", "UTF-8"),  # a Latin-1 file name seen through os.fsdecode
        ("images/" + "a" * 1100 + ".jpg", "1111 bytes"),
        ("images/" + "é" * 510 + ".jpg", "1031 bytes"),  # 517 characters, over 1024 bytes
        ("images/" + "b" * 300 + ".jpg", "longer than 255"),
        ("", "empty"),
    ],
)
def test_a_name_unsafe_as_a_path_or_key_is_refused(key: str, why: str) -> None:
    with pytest.raises(RejectedError) as raised:
        check_key_safety(key)

    assert raised.value.code is ReasonCode.UNSAFE_NAME
    assert why in raised.value.message


@pytest.mark.parametrize(
    "key",
    [
        "images/rue de la paix 12.jpg",
        "images/a+b=c.jpg",
        "images/東京駅 前.jpg",
        "images/Straße_München.jpeg",
        "images/Ωmega-ζ.png",
        "images/0_2026-01-01T10:00:00.png",  # Ground Truth writes colons
        "images/" + "é" * 100 + ".jpg",
    ],
)
def test_names_with_spaces_plus_signs_and_any_letters_are_fine(key: str) -> None:
    check_key_safety(key)
    assert classify_key(key, DEFAULT_CONFIG).kind is KeyKind.IMAGE
    assert check_image(png() if key.endswith(".png") else jpeg(), key).ok


def test_an_unsafe_name_is_reported_before_the_bytes_are_read() -> None:
    check = check_image(b"", "images/../a.jpg")

    assert [reason.code for reason in check.reasons] == [ReasonCode.UNSAFE_NAME]


def test_a_very_long_unsafe_name_is_shortened_in_the_message() -> None:
    check = check_image(jpeg(), "images/" + "x" * 2000 + ".jpg")

    assert check.reasons[0].code is ReasonCode.UNSAFE_NAME
    assert len(check.reasons[0].message) < 300


@pytest.mark.parametrize(
    ("key", "kind", "stem"),
    [
        ("images/a.b.JPG", KeyKind.IMAGE, "a.b"),
        ("labels/a.b.png", KeyKind.LABEL, "a.b"),
        ("_COMPLETE", KeyKind.MARKER, ""),
        ("images/cafe\u0301.jpg", KeyKind.IMAGE, "caf\u00e9"),  # macOS's decomposed é
    ],
)
def test_batch_keys_are_classified_by_folder_and_stem(key: str, kind: KeyKind, stem: str) -> None:
    batch_key = classify_key(key, DEFAULT_CONFIG)

    assert (batch_key.kind, batch_key.stem) == (kind, stem)


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("notes.txt", ReasonCode.UNEXPECTED_FILE),
        ("images/sub/a.jpg", ReasonCode.UNEXPECTED_FILE),
        ("masks/a.png", ReasonCode.UNEXPECTED_FILE),
        ("labels/a.jpg", ReasonCode.UNSUPPORTED_EXTENSION),
        ("images/.DS_Store", ReasonCode.UNSUPPORTED_EXTENSION),
    ],
)
def test_keys_outside_the_layout_are_refused(key: str, code: ReasonCode) -> None:
    with pytest.raises(RejectedError) as raised:
        classify_key(key, DEFAULT_CONFIG)

    assert raised.value.code is code


@pytest.mark.parametrize(
    ("batch", "why"),
    [
        ("..", "'..'"),
        (".", "'.'"),
        ("a\x01b", "U+0001"),
        ("week\n12", "U+000A"),
        ("\u202egpj", "U+202E"),
        ("zero\u200bwidth", "U+200B"),
        ("back\\slash", "backslash"),
        ("C:", "absolute"),
        ("caf\udce9", "UTF-8"),
        ("b" * 256, "longer than 255"),
    ],
)
def test_a_batch_folder_is_held_to_the_rules_of_a_file_name(batch: str, why: str) -> None:
    with pytest.raises(RejectedError) as raised:
        check_batch_safety(batch)
    with pytest.raises(RejectedError) as landing:
        check_landing_key(f"incoming/{batch}/images/a.jpg")

    assert raised.value.code is landing.value.code is ReasonCode.UNSAFE_NAME
    assert why in raised.value.message
    assert "batch folder" in landing.value.message


@pytest.mark.parametrize("batch", ["munich-12", "rue de la paix", "東京 2026", "a+b", "b" * 255])
def test_batch_folders_with_spaces_plus_signs_and_any_letters_are_fine(batch: str) -> None:
    check_batch_safety(batch)
    check_landing_key(f"incoming/{batch}/images/a.jpg")


def test_a_landing_key_over_the_cap_is_refused_with_the_limit_in_the_message() -> None:
    prefix = "incoming/b/"
    at_cap = prefix + "d/" * ((MAX_INCOMING_KEY_BYTES - len(prefix)) // 2)
    at_cap += "x" * (MAX_INCOMING_KEY_BYTES - len(at_cap))
    assert len(at_cap.encode()) == MAX_INCOMING_KEY_BYTES

    check_landing_key(at_cap)
    with pytest.raises(RejectedError) as raised:
        check_landing_key(at_cap + "x")

    assert raised.value.code is ReasonCode.UNSAFE_NAME
    assert f"{MAX_INCOMING_KEY_BYTES + 1} bytes" in raised.value.message
    assert f"limit of {MAX_INCOMING_KEY_BYTES}" in raised.value.message


def test_the_cap_counts_utf8_bytes_not_characters() -> None:
    key = "incoming/b/images/" + "é" * ((MAX_INCOMING_KEY_BYTES - 17) // 2 + 1)  # 2 bytes each
    assert len(key) < MAX_INCOMING_KEY_BYTES < len(key.encode())

    with pytest.raises(RejectedError, match="bytes in UTF-8"):
        check_landing_key(key)
