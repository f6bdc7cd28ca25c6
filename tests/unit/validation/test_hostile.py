"""Hostile and mangled files: rejected from their headers, in bounded memory, never a crash."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import pytest
from PIL import ImageFile

from functions.validation import (
    FileCheck,
    ReasonCode,
    StrictDecodingDisabledError,
    ValidationConfig,
    check_image,
    check_label,
)

from .corpus import chunk, filled_png, jpeg, mask, png, raw_png, with_jpeg_size

REPO = Path(__file__).resolve().parents[3]


def only_reason(check: FileCheck) -> ReasonCode:
    assert len(check.reasons) == 1, check.reasons
    return check.reasons[0].code


def test_a_tiny_png_declaring_60000_by_60000_is_a_bomb_caught_before_decoding() -> None:
    bomb = raw_png(60000, 60000)  # a few hundred bytes that would decode to 3.6 GB
    tracemalloc.start()
    try:
        check = check_image(bomb, "images/bomb.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB
    assert "60000x60000" in check.reasons[0].message
    assert peak < 1_000_000


def test_a_png_under_pillows_limit_but_over_ours_is_still_a_bomb() -> None:
    check = check_label(raw_png(8000, 8000), "labels/big.png")  # 64 M pixels, Pillow would decode

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB
    assert "40000000" in check.reasons[0].message


def test_a_jpeg_declaring_an_absurd_size_is_a_bomb() -> None:
    check = check_image(with_jpeg_size(jpeg(), 65000, 65000), "images/bomb.jpg")

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB


def test_a_jpeg_declaring_a_size_between_our_limit_and_pillows_is_a_bomb() -> None:
    check = check_image(with_jpeg_size(jpeg(), 8000, 6000), "images/bomb.jpg")

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB
    assert "8000x6000" in check.reasons[0].message


def test_compressed_png_text_that_expands_to_megabytes_is_a_bomb() -> None:
    text_bomb = chunk(b"zTXt", b"comment\x00\x00" + zlib.compress(b"a" * 5_000_000, 9))

    check = check_image(raw_png(64, 32, before_idat=text_bomb), "images/text-bomb.png")

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB


def test_a_compressed_color_profile_that_expands_to_megabytes_is_a_bomb() -> None:
    profile_bomb = chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"\x00" * 5_000_000, 9))

    check = check_image(raw_png(64, 32, before_idat=profile_bomb), "images/icc-bomb.png")

    assert only_reason(check) is ReasonCode.DECOMPRESSION_BOMB


def test_memory_stays_bounded_on_a_corpus_of_hostile_files(tmp_path: Path) -> None:
    """In a fresh process (Pillow allocates pixels outside Python's tracked heap), with the
    address space capped so a broken guard fails fast instead of swapping."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to size the address-space cap")
    hostile = {
        "images/a.png": raw_png(60000, 60000),
        "images/b.png": raw_png(60000, 60000, color_type=6),
        "labels/c.png": raw_png(20000, 20000),
        "images/d.jpg": with_jpeg_size(jpeg(), 65000, 65000),
        "images/e.jpg": with_jpeg_size(jpeg(), 8000, 8000),
        "labels/f.png": filled_png(8000, 8000),  # decoded, it would take 64 MB
    }
    for number, data in enumerate(hostile.values()):
        (tmp_path / str(number)).write_bytes(data)
    script = textwrap.dedent(
        f"""
        import json, resource
        from pathlib import Path
        from functions.validation import check_image, check_label

        def rss_mb():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        keys = {list(hostile)!r}
        check_image(Path({str(tmp_path)!r}, "4").read_bytes()[:2000], "images/warm.jpg")
        before = rss_mb()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        status = Path("/proc/self/status").read_text()
        size = int(status.split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 1024 * 1024, hard))
        codes = []
        for number, key in enumerate(keys):
            data = Path({str(tmp_path)!r}, str(number)).read_bytes()
            check = check_label if key.startswith("labels") else check_image
            codes.append(check(data, key).reasons[0].code)
        print(json.dumps({{"codes": codes, "grew_mb": rss_mb() - before}}))
        """
    )

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["codes"]) == {ReasonCode.DECOMPRESSION_BOMB}
    assert report["grew_mb"] < 32


def _mutants(seed: int, data: bytes, count: int) -> list[bytes]:
    rng = random.Random(seed)
    mutants = []
    for _ in range(count):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cut = rng.choice([len(mutated), rng.randrange(1, len(mutated))])
        mutants.append(bytes(mutated[:cut]))
    return mutants


@pytest.mark.parametrize(
    ("seed", "key", "data"),
    [
        (1, "images/fuzz.jpg", jpeg()),
        (2, "images/fuzz.png", png()),
        (3, "labels/fuzz.png", mask()),
    ],
)
def test_mangled_bytes_never_crash_the_validator(seed: int, key: str, data: bytes) -> None:
    check = check_label if key.startswith("labels") else check_image

    for mutant in _mutants(seed, data, 150):
        result = check(mutant, key)  # must return, whatever the bytes
        assert all(isinstance(reason.code, ReasonCode) for reason in result.reasons)


def test_a_process_that_tolerates_truncated_images_refuses_to_validate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)

    with pytest.raises(StrictDecodingDisabledError):
        check_image(jpeg()[:300], "images/cut.jpg")


def test_the_pixel_limit_cannot_be_raised_past_pillows_own_guard() -> None:
    with pytest.raises(ValueError, match="max_pixels"):
        ValidationConfig(max_pixels=500_000_000)
